"""The two ways `flashcheck compare` states a comparison — a simulator configuration (CompareConfig) and a
backend case (BackendCase) — as measure.Case, run through measure.run_case, and their JSON forms."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from flashcheck.backends.base import DEVICES
from flashcheck.core.inputs import InputSpec
from flashcheck.core.numerics import DELTA_SOURCES, FP8_FORMATS, Policy, info, parse_format, parse_policy
from flashcheck.kernels import SIMULATED_KERNELS
from flashcheck.kernels.sim.decode import split_spans
from flashcheck.kernels.sim.memory import Footprint, check_fits
from flashcheck.measure.case import Case, Record, References, run_case
from flashcheck.measure.method import Method, parse_method

KERNELS = SIMULATED_KERNELS


@dataclass(frozen=True, slots=True, kw_only=True)
class CompareConfig:
    """One simulator comparison. `baseline_numerics` defaults to `numerics` (baseline-fp8 where that scales FP8 per
    block: baseline_policy); `fp8_scaling` and `hadamard`,
    when set (not None), override the candidate policy's (the baseline keeps its own). `splits`: key chunks S of the
    splitkv kernel (None: its default, 4). `backward`: dQ, dK, dV errors too; `delta_source` and
    `ds_correction` (Policy's backward knobs, flash only) then override the candidate policy's."""

    kernel: str = "flash"
    numerics: str = "bf16-mixed"
    baseline_numerics: str | None = None
    algorithm: str = "fa2"
    block_q: int = 128
    block_k: int = 128
    inputs: InputSpec = field(default_factory=InputSpec)
    causal: bool = False
    fp8_scaling: str | None = None
    hadamard: bool | None = None  # None: as the candidate policy has it
    device: str = "cpu"  # where both simulators and the FP64 references run (cpu or cuda)
    splits: int | None = None
    backward: bool = False
    delta_source: str | None = None
    ds_correction: bool = False

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"device {self.device!r} is not allowed; expected one of {', '.join(DEVICES)}")
        if self.kernel not in KERNELS:
            raise ValueError(f"unknown kernel {self.kernel!r}; expected one of {', '.join(KERNELS)}")
        _check_decoding(self)
        _check_backward(self)
        if self.fp8_scaling is not None and parse_policy(self.numerics).input not in FP8_FORMATS:
            raise ValueError(
                f"--fp8-scaling {self.fp8_scaling}: the candidate policy {self.numerics!r} has no FP8 inputs to scale; "
                "give an FP8 policy (e.g. --numerics fa3-fp8) or drop --fp8-scaling"
            )
        for role, pol in (("candidate", self.candidate_policy()), ("baseline", self.baseline_policy())):
            if pol.fp8_scaling == "block" and (role == "baseline" or self.kernel == "standard"):
                raise ValueError(
                    f"the {role} policy {pol.name!r} scales FP8 per block, which needs the flash kernel's tiles; "
                    "the standard kernel scales per tensor: give --baseline-numerics baseline-fp8 (or a policy "
                    "with fp8_scaling=tensor)"
                )

    def candidate_policy(self) -> Policy:
        pol = parse_policy(self.numerics)
        changes: dict[str, object] = {}
        if self.fp8_scaling is not None:
            changes["fp8_scaling"] = self.fp8_scaling
        if self.hadamard is not None:
            changes["hadamard"] = self.hadamard
        if self.delta_source is not None:
            changes["delta_source"] = self.delta_source
        if self.ds_correction:
            changes["ds_correction"] = True
        return dataclasses.replace(pol, **changes) if changes else pol

    def baseline_policy(self) -> Policy:
        """--baseline-numerics, else the candidate's policy; a candidate policy that scales FP8 per block (fa3-fp8),
        which the standard kernel cannot, is divided by baseline-fp8, as real backends' FP8 formats are (the one
        baseline rule, measure.method.Method.baseline)."""
        if self.baseline_numerics:
            return parse_policy(self.baseline_numerics)
        pol = parse_policy(self.numerics)
        return parse_policy("baseline-fp8") if pol.fp8_scaling == "block" else pol

    def case(self) -> Case:
        """The measure.Case: the kernel under the candidate policy, standard attention under the baseline's."""
        tiled = self.kernel in ("flash", "splitkv")  # splitkv: flash chunks (4 splits unless `splits`)
        cand = Method(
            kernel=self.kernel,
            policy=self.candidate_policy(),
            block_q=self.block_q if tiled else 0,
            block_k=self.block_k if tiled else 0,
            algorithm=self.algorithm if tiled else "",
            device=self.device,
            **({"splits": self.splits} if self.splits is not None else {}),
        )
        base = Method(
            kernel="standard", policy=self.baseline_policy(), block_q=0, block_k=0, algorithm="", device=self.device
        )
        return Case(inputs=self.inputs, method=cand, baseline=base, causal=self.causal, backward=self.backward)

    def chunks(self) -> int | None:
        """How many key chunks the splitkv kernel computes (fewer than `splits` when there are fewer key
        blocks); None for the other kernels."""
        if self.kernel != "splitkv":
            return None
        s = self.inputs
        return len(split_spans(s.seq_len_k or s.seq_len, self.case().method.splits, self.block_k))

    def footprint(self) -> Footprint:
        """The sizes that set this comparison's memory (see kernels.sim.memory)."""
        work = max(p.work_dtype.itemsize for p in (self.candidate_policy(), self.baseline_policy()))
        base = self.baseline_policy()
        fp = _footprint(self.inputs, (self.kernel, "standard"), self.block_k, work, self.backward)
        rounds = info(base.stage("p")).dtype != base.work_dtype or work != base.work_dtype.itemsize
        return dataclasses.replace(fp, rounds_p=rounds)  # the standard kernel runs under the baseline policy

    def to_dict(self) -> dict:
        d = {k: v for k, v in dataclasses.asdict(self).items() if k != "inputs"}
        s = self.inputs
        d.update(batch=s.batch, heads=s.heads, seq_len=s.seq_len, head_dim=s.head_dim)
        d.update(distribution=s.distribution, seed=s.seed, kv_heads=s.kv_heads, seq_len_k=s.seq_len_k)
        d.update(padding=s.padding)
        if self.kernel == "splitkv":
            d.update(splits=self.case().method.splits, chunks=self.chunks())
        d["candidate_policy"] = self.candidate_policy().to_dict()
        d["baseline_policy"] = self.baseline_policy().to_dict()
        return d


def _check_decoding(cfg: CompareConfig) -> None:
    if cfg.splits is None:
        return
    if cfg.kernel != "splitkv":
        raise ValueError(f"splits={cfg.splits!r} is for the splitkv kernel, not {cfg.kernel!r}")
    if isinstance(cfg.splits, bool) or not isinstance(cfg.splits, int) or cfg.splits < 1:
        raise ValueError(f"splits={cfg.splits!r} is not allowed; give a positive integer")


def _check_backward(cfg: CompareConfig) -> None:
    """The backward knobs need the backward pass and act in the flash kernel's backward only."""
    if cfg.delta_source is not None and cfg.delta_source not in DELTA_SOURCES:
        raise ValueError(
            f"delta_source={cfg.delta_source!r} is not allowed; expected one of {', '.join(DELTA_SOURCES)}"
        )
    knobs = [
        n for n, on in (("delta_source", cfg.delta_source is not None), ("ds_correction", cfg.ds_correction)) if on
    ]
    if knobs and not cfg.backward:
        raise ValueError(f"{' and '.join(knobs)} change the backward pass only; set backward=True")
    if knobs and cfg.kernel != "flash":
        raise ValueError(f"{' and '.join(knobs)} act in the flash kernel's backward, not {cfg.kernel!r}'s")
    if cfg.backward and cfg.kernel == "splitkv":
        raise ValueError("the splitkv kernel (split-KV decoding) runs forward only; compare it without backward")


def run_compare(cfg: CompareConfig, refs: References | None = None) -> Record:
    """Run the simulator comparison; refuses with kernels.sim.memory.InsufficientMemory (a ValueError) before
    allocating when it cannot fit here. A kernel error propagates (it is the user's configuration). `refs`:
    the inputs and FP64 references of an earlier comparison on the same InputSpec, reused when they match."""
    check_fits(cfg.footprint())
    rec = run_case(cfg.case(), _references(cfg, refs))
    if rec.status != "ok":
        raise ValueError(rec.reason.splitlines()[0])
    return rec


def _references(cfg: CompareConfig, refs: References | None) -> References:
    """`refs` when they hold cfg's inputs, else new ones; ValueError when no query row sees a key (every error
    would be over nothing: right padding removes the keys that decoding queries sit at)."""
    if refs is None or refs.spec != cfg.inputs or refs.causal != cfg.causal or str(refs.device) != cfg.device:
        refs = References(cfg.inputs, causal=cfg.causal, device=cfg.device)
    if refs.live is not None and not bool(refs.live.any()):
        s = cfg.inputs
        raise ValueError(
            f"padding {s.padding!r} leaves no query row a visible key (seq_len={s.seq_len}, seq_len_k={s.lk}"
            f"{', causal' if cfg.causal else ''}): there is no error to measure; pad on the left instead"
        )
    return refs


def decoding_configs(cfg: CompareConfig, splits: list[int]) -> list[CompareConfig]:
    """The split-KV decoding comparison: `cfg` with the flash kernel, then the splitkv kernel at each S in
    `splits`, on the same inputs and policies (flash is the peer each split count is read against)."""
    if cfg.kernel == "standard":
        raise ValueError("splits compare the splitkv kernel with flash; the candidate kernel cannot be 'standard'")
    flash = dataclasses.replace(cfg, kernel="flash", splits=None)
    return [flash, *(dataclasses.replace(cfg, kernel="splitkv", splits=s) for s in splits)]


def run_compares(cfgs: list[CompareConfig], done=None) -> list[Record]:
    """run_compare for each config, drawing the inputs and computing the FP64 references once when they
    share an InputSpec and mask; `done(cfg)` is called after each."""
    refs, out = None, []
    for cfg in cfgs:
        check_fits(cfg.footprint())
        refs = _references(cfg, refs)
        out.append(run_compare(cfg, refs))
        if done is not None:
            done(cfg)
    return out


def compare_dict(cfg: CompareConfig, rec: Record) -> dict:
    """The JSON form of a simulator comparison; with backward, `grad`: per dq/dk/dv the candidate's and the
    baseline's errors against FP64 autograd through the reference, and their ratio."""
    out = {
        "config": cfg.to_dict(),
        "candidate": rec.candidate,
        "baseline": rec.baseline,
        "ratio": rec.ratio,
        "vs_rounded_inputs": {"candidate": rec.candidate_rounded},
        "baseline_impl": rec.baseline_name,
    }
    if rec.grad is not None:
        keep = ("candidate", "baseline", "ratio")
        out["grad"] = {name: {k: g[k] for k in keep} for name, g in rec.grad.items()}
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendCase:
    """One backend at one dtype on one input set. `preset` / `policy` / blocks configure sim-flash;
    `baseline_numerics` replaces the one baseline rule's eager same-precision baseline by standard
    attention under that policy."""

    backend: str
    numerics: str = "bf16"
    inputs: InputSpec = field(default_factory=InputSpec)
    causal: bool = False
    preset: str | None = None
    policy: str | None = None
    block_q: int = 128
    block_k: int = 128
    algorithm: str = "fa2"
    baseline_numerics: str | None = None
    backward: bool = False
    determinism: int = 0  # repeated runs to compare bit for bit (0: skip)

    def __post_init__(self) -> None:
        from flashcheck.backends import get_backend

        get_backend(self.backend)  # "unknown backend ... (did you mean ...)"
        self.method("cpu")  # unknown backend, format, preset or policy: ValueError now, not a failed record

    @property
    def seq_len(self) -> int:
        return self.inputs.seq_len

    def method(self, device: str) -> Method:
        return parse_method(
            f"{self.backend}:{self.numerics}",
            preset=self.preset,
            policy=self.policy,
            block_q=self.block_q,
            block_k=self.block_k,
            algorithm=self.algorithm,
            device=device,
        )

    def case(self, device: str) -> Case:
        base = None
        if self.baseline_numerics:
            pol = parse_policy(self.baseline_numerics)
            base = Method(kernel="standard", policy=pol, block_q=0, block_k=0, algorithm="")
        return Case(
            inputs=self.inputs,
            method=self.method(device),
            baseline=base,
            causal=self.causal,
            backward=self.backward,
            determinism=self.determinism,
            verify_kernel=True,
        )

    def to_dict(self) -> dict:
        d = {k: v for k, v in dataclasses.asdict(self).items() if k != "inputs"}
        s = self.inputs
        d.update(seq_len=s.seq_len, batch=s.batch, heads=s.heads, head_dim=s.head_dim)
        d.update(distribution=s.distribution, seed=s.seed)
        return d


def backend_footprint(case: BackendCase) -> Footprint:
    """The memory footprint of a BackendCase: the eager or SDPA-math baseline holds L x L scores (fp32 at
    most, fp64 for fp64 inputs or policies), the FP64 reference runs beside it, and --determinism adds a
    batch of at least 2."""
    itemsize = max(4, info(parse_format(case.numerics)).dtype.itemsize)
    for pol in (case.policy, case.baseline_numerics):
        if pol:
            itemsize = max(itemsize, parse_policy(pol).work_dtype.itemsize)
    return _footprint(case.inputs, ("standard", "flash"), case.block_k, itemsize, case.backward, case.determinism > 0)


def _footprint(
    s: InputSpec, kernels: tuple[str, ...], block_k: int, itemsize: int, backward: bool = False, pair: bool = False
) -> Footprint:
    """The Footprint of inputs `s` (a batch of at least 2 with `pair`, as the determinism check draws)."""
    return Footprint(
        batch=max(2, s.batch) if pair else s.batch,
        heads=s.heads,
        seq_len=s.seq_len,
        seq_len_k=s.seq_len_k,
        head_dim=s.head_dim,
        kernels=kernels,
        block_k=block_k,
        work_itemsize=itemsize,
        backward=backward,
    )


def run_backend_case(case: BackendCase, *, device: str) -> dict:
    """The comparison as a JSON-able object: status ok, skipped (with the reason it cannot run here) or
    failed (with the error). `device` ("cpu" or "cuda") is where a real backend and its eager baseline run;
    simulators run on the CPU; the config records the device used."""
    if device not in DEVICES:
        raise ValueError(f"device {device!r} is not allowed; expected one of {', '.join(DEVICES)}")
    case_m = case.case(device)
    m = case_m.method
    label = getattr(m.backend(), "label", lambda: m.kernel)()
    head = {"config": {**case.to_dict(), "label": label, "device": m.run_device}}
    rec = run_case(case_m)
    if rec.status != "ok":
        return {**head, "status": rec.status, "reason": rec.reason}
    out = {
        **head,
        "status": "ok",
        "baseline_impl": rec.baseline_name,
        "candidate": rec.candidate,
        "baseline": rec.baseline,
        "ratio": rec.ratio,
        "vs_rounded_inputs": {"candidate": rec.candidate_rounded},
        "kernel_ops": list(rec.kernel_ops or ()),
        "kernel_verified": rec.kernel_verified,
        "budget": rec.budget,
    }
    if rec.grad is not None:
        out["grad"] = rec.grad
    if rec.determinism is not None:
        out["determinism"] = rec.determinism
    return out
