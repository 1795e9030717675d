"""Deterministic generator of the built-in validation corpus (data/corpus.txt), written for this package.

Texts come from a small grammar over topic word banks: short search queries, single sentences, short
paragraphs, long passages (past 256 tokens, so that truncation to a model's maximum length is exercised),
reviews, lists, dialogue lines, code-like lines and a few texts in other scripts. Regenerate with
`python -m flashcheck.validate.corpus_gen > src/flashcheck/validate/data/corpus.txt`; a test checks the
shipped file equals this output, so the corpus is reproducible and license-clean.
"""

from __future__ import annotations

import random

TOPICS: dict[str, dict[str, list[str]]] = {
    "cooking": {
        "nouns": [
            "sourdough starter",
            "cast iron pan",
            "risotto",
            "tomato sauce",
            "bread dough",
            "chickpea curry",
            "pie crust",
            "vegetable stock",
            "lentil soup",
            "omelette",
            "roast chicken",
            "pasta water",
        ],
        "verbs": ["simmer", "knead", "season", "roast", "whisk", "braise", "proof", "caramelise"],
        "adjs": ["crispy", "tender", "overcooked", "fragrant", "bland", "silky", "burnt", "fluffy"],
    },
    "software": {
        "nouns": [
            "database migration",
            "unit test",
            "memory leak",
            "API endpoint",
            "build pipeline",
            "cache layer",
            "race condition",
            "config file",
            "container image",
            "query planner",
            "log parser",
            "retry loop",
        ],
        "verbs": ["refactor", "deploy", "profile", "debug", "roll back", "benchmark", "document", "review"],
        "adjs": ["flaky", "slow", "deprecated", "thread-safe", "idempotent", "verbose", "stateless", "brittle"],
    },
    "travel": {
        "nouns": [
            "night train",
            "mountain hostel",
            "ferry crossing",
            "old town",
            "border check",
            "hiking trail",
            "rental car",
            "window seat",
            "coastal road",
            "visa application",
            "museum pass",
            "street market",
        ],
        "verbs": ["book", "explore", "cancel", "pack", "navigate", "wander", "reschedule", "photograph"],
        "adjs": ["crowded", "scenic", "delayed", "quiet", "overpriced", "remote", "charming", "chaotic"],
    },
    "finance": {
        "nouns": [
            "index fund",
            "mortgage rate",
            "emergency fund",
            "tax return",
            "credit score",
            "pension plan",
            "exchange rate",
            "quarterly report",
            "savings account",
            "bond yield",
            "budget sheet",
            "invoice",
        ],
        "verbs": ["rebalance", "refinance", "audit", "forecast", "hedge", "invest", "withdraw", "reconcile"],
        "adjs": ["volatile", "fixed", "overdue", "diversified", "taxable", "liquid", "conservative", "risky"],
    },
    "health": {
        "nouns": [
            "sleep schedule",
            "knee injury",
            "blood pressure",
            "running plan",
            "vitamin D",
            "allergy season",
            "physical therapy",
            "hydration",
            "posture",
            "heart rate",
            "stretching routine",
            "flu vaccine",
        ],
        "verbs": ["recover", "stretch", "monitor", "prevent", "rest", "strengthen", "measure", "treat"],
        "adjs": ["chronic", "mild", "sore", "steady", "irregular", "healthy", "inflamed", "tired"],
    },
    "science": {
        "nouns": [
            "photosynthesis",
            "black hole",
            "protein folding",
            "ocean current",
            "gene expression",
            "comet tail",
            "crystal lattice",
            "neural network",
            "plate tectonics",
            "enzyme",
            "solar wind",
            "ice core",
        ],
        "verbs": ["observe", "simulate", "measure", "replicate", "model", "sequence", "calibrate", "predict"],
        "adjs": ["stable", "chaotic", "microscopic", "ancient", "unexpected", "precise", "noisy", "symmetric"],
    },
    "sports": {
        "nouns": [
            "penalty kick",
            "marathon",
            "relay team",
            "free throw",
            "tennis serve",
            "goalkeeper",
            "cycling stage",
            "swim lap",
            "chess opening",
            "climbing route",
            "training camp",
            "final whistle",
        ],
        "verbs": ["train", "defend", "sprint", "score", "coach", "qualify", "tackle", "pace"],
        "adjs": ["decisive", "exhausted", "undefeated", "aggressive", "tactical", "injured", "young", "dominant"],
    },
    "history": {
        "nouns": [
            "trade route",
            "medieval castle",
            "printing press",
            "silk road",
            "steam engine",
            "city wall",
            "ancient library",
            "treaty",
            "harbour town",
            "railway line",
            "royal archive",
            "clay tablet",
        ],
        "verbs": ["rebuild", "trade", "conquer", "record", "restore", "excavate", "translate", "found"],
        "adjs": ["forgotten", "fortified", "prosperous", "ruined", "colonial", "sacred", "rural", "imperial"],
    },
    "music": {
        "nouns": [
            "bass line",
            "string quartet",
            "drum loop",
            "chord progression",
            "vinyl record",
            "choir",
            "jazz standard",
            "guitar solo",
            "film score",
            "synth pad",
            "piano sonata",
            "live set",
        ],
        "verbs": ["compose", "rehearse", "remix", "tune", "perform", "record", "arrange", "improvise"],
        "adjs": ["melancholic", "upbeat", "distorted", "acoustic", "minimal", "layered", "loud", "haunting"],
    },
    "gardening": {
        "nouns": [
            "tomato plant",
            "compost heap",
            "raised bed",
            "rose bush",
            "seed tray",
            "apple tree",
            "herb garden",
            "lawn",
            "greenhouse",
            "rain barrel",
            "potting soil",
            "strawberry patch",
        ],
        "verbs": ["prune", "water", "plant", "harvest", "mulch", "transplant", "fertilise", "weed"],
        "adjs": ["wilted", "thriving", "shady", "frost-damaged", "organic", "overgrown", "drought-tolerant", "lush"],
    },
}

PEOPLE = [
    "my neighbour",
    "the new intern",
    "our team lead",
    "a friend of mine",
    "the landlord",
    "my sister",
    "the support engineer",
    "an old colleague",
    "the tour guide",
    "the coach",
]
TIMES = [
    "yesterday",
    "last winter",
    "every Monday",
    "since March",
    "after the update",
    "this morning",
    "in 2019",
    "twice a week",
    "before the deadline",
    "during the holidays",
]
PLACES = [
    "in Lisbon",
    "at the office",
    "near the station",
    "in a small village",
    "on the third floor",
    "by the river",
    "in the basement",
    "at home",
    "in Kraków",
    "in São Paulo",
]
OTHER_SCRIPTS = [
    "Η ζωή είναι ωραία όταν ο ήλιος λάμπει.",
    "Привет, как дела у вашей команды сегодня?",
    "今日は天気がいいので散歩に行きます。",
    "오늘 회의는 오후 세 시에 시작합니다.",
    "Ça coûte combien, le café crème à emporter ?",
    "Über die Brücke fährt täglich ein Güterzug.",
    "El niño comió una piña en la mañana.",
    "Müşteri hizmetleri hafta sonu kapalıdır.",
]


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def _sentence(rng: random.Random, topic: str) -> str:
    w = TOPICS[topic]
    n1, n2 = rng.sample(w["nouns"], 2)
    v, a = rng.choice(w["verbs"]), rng.choice(w["adjs"])
    forms = [
        f"{_cap(rng.choice(PEOPLE))} tried to {v} the {n1} {rng.choice(TIMES)}, but it turned out {a}.",
        f"The {a} {n1} {rng.choice(PLACES)} made it hard to {v} the {n2}.",
        f"If you {v} the {n1} first, the {n2} stays {a} for much longer.",
        f"Nobody expected the {n1} to be so {a} {rng.choice(TIMES)}.",
        f"We learned to {v} a {a} {n1} {rng.choice(PLACES)}, which changed how we think about the {n2}.",
        f"Is it normal for a {n1} to become {a} after you {v} it?",
        f"About {rng.randint(2, 97)}% of people who {v} the {n1} say the {n2} matters more.",
        f"{_cap(rng.choice(TIMES))}, the {n1} was {a}; now the {n2} is what worries us.",
    ]
    return rng.choice(forms)


def _query(rng: random.Random, topic: str) -> str:
    w = TOPICS[topic]
    n, v, a = rng.choice(w["nouns"]), rng.choice(w["verbs"]), rng.choice(w["adjs"])
    forms = [
        f"how to {v} {n}",
        f"{a} {n}",
        f"why is my {n} {a}",
        f"best way to {v} a {n} {rng.choice(PLACES)}",
        f"{n} vs {rng.choice(w['nouns'])}",
        f"{v} {n} {rng.choice(TIMES)}",
        f"{n}?",
        f"is a {a} {n} bad",
    ]
    return rng.choice(forms)


def _paragraph(rng: random.Random, topic: str, sentences: int) -> str:
    return " ".join(_sentence(rng, topic) for _ in range(sentences))


def _special(rng: random.Random, topic: str) -> str:
    w = TOPICS[topic]
    kind = rng.randrange(5)
    if kind == 0:
        stars = rng.randint(1, 5)
        return f"Review ({stars}/5): {_sentence(rng, topic)} {'Would buy again.' if stars > 3 else 'Not worth it.'}"
    if kind == 1:
        items = rng.sample(w["nouns"], 4)
        return f"Checklist for {rng.choice(w['verbs'])}ing: " + "; ".join(f"{i + 1}) {x}" for i, x in enumerate(items))
    if kind == 2:
        return f"Q: {_query(rng, topic)}? A: {_sentence(rng, topic)}"
    if kind == 3:
        n = rng.choice(w["nouns"]).replace(" ", "_")
        return f"{n} = load('{n}.json'); assert {n}.size == {rng.randint(1, 4096)}  # {rng.choice(w['adjs'])}"
    return f"{rng.choice(OTHER_SCRIPTS)} {_query(rng, topic)}"


def generate_corpus(n: int = 1200, seed: int = 2405) -> list[str]:
    """`n` distinct texts of mixed length: ~35% queries, ~30% sentences, ~17% paragraphs (3-8 sentences),
    ~6% long passages (14-30 sentences), ~12% special forms. Deterministic in (n, seed)."""
    if n < 1:
        raise ValueError(f"n={n} is not allowed; the corpus needs at least one text")
    rng = random.Random(seed)
    topics = sorted(TOPICS)
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < n:
        topic = rng.choice(topics)
        r = rng.random()
        if r < 0.35:
            text = _query(rng, topic)
        elif r < 0.65:
            text = _sentence(rng, topic)
        elif r < 0.82:
            text = _paragraph(rng, topic, rng.randint(3, 8))
        elif r < 0.88:
            text = _paragraph(rng, topic, rng.randint(14, 30))
        else:
            text = _special(rng, topic)
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


if __name__ == "__main__":
    print("\n".join(generate_corpus()))
