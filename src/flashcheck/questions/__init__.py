"""The question sets of `flashcheck study`, one package each, registered with the engine (study.registry) when
this package is imported (the engine imports it on its first look-up): the paper's, the attention variants',
the production guide's, the modern kernels' and serving's; and the presets that ask several of them at once."""

from __future__ import annotations

from flashcheck.questions import guide, modern, paper, serving, variants
from flashcheck.questions.presets import full, quick, tiny
from flashcheck.study.registry import QuestionSet, register

SHIPPED = (paper.QUESTION_SET, variants.QUESTION_SET, guide.QUESTION_SET, modern.QUESTION_SET, serving.question_set())
STUDIES = QuestionSet(name="studies", order=0, presets={"quick": quick, "full": full, "tiny": tiny})

for _qs in (STUDIES, *SHIPPED):
    register(_qs)
