"""The answers an upgrade gate compared, kept in a ConfigMap per migration.

The AgentMigration's status keeps the verdict and the worst disagreements by
reference (seq, score, reason): it is read by every watch of the kind and rewritten on
every phase, and each answer may be kilobytes long. The answers themselves — every
compared turn, what the source said and what the target said, the judge's score and
reason — go once, when the verdict is in, into ``<migration>-answers``, owned by the
AgentMigration (deleted with it), where ``kubectl shadowpod diff`` reads them. A
ConfigMap holds at most 1 MiB: each answer is cut at ``ANSWER_CHARS`` characters and
each comparison at ``MAX_TURNS`` turns, and the document says how much was cut.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field

from shadowpod.gates.verdicts import TurnVerdict
from shadowpod.kube import names
from shadowpod.kube.api import AlreadyExists, KubeApi, namespaced

ANSWERS_KEY: Final = "answers.json"
FORMAT: Final = 1
ANSWER_CHARS: Final = 4000
MAX_TURNS: Final = 300
# Below the API server's 1 MiB limit on an object, with room for its metadata.
MAX_BYTES: Final = 900_000


class TurnAnswers(BaseModel):
    """One compared turn: the source's answer (``old``) and the target's (``new``)."""

    model_config = ConfigDict(frozen=True)

    seq: int
    agreed: bool
    score: float
    reason: str
    old: str
    new: str


class Comparison(BaseModel):
    """The live turns (``golden`` unset) or one golden session, as judged."""

    model_config = ConfigDict(frozen=True)

    golden: str | None = None
    judge: str
    passed: bool
    compared: int
    agreed: int
    threshold: float
    turns: list[TurnAnswers] = Field(default_factory=list)


class Answers(BaseModel):
    """What ``<migration>-answers`` holds (``answers.json``)."""

    model_config = ConfigDict(frozen=True)

    format: int = FORMAT
    migration: str
    session: str
    source_image: str
    target_image: str
    comparisons: list[Comparison] = Field(default_factory=list)
    cut: int = Field(default=0, description="Answers cut short, or turns left out, to fit.")


CUT_MARK: Final = " […]"


def _cut(text: str, limit: int) -> tuple[str, bool]:
    """``text`` at most ``limit`` characters (and the mark), and whether it is newly cut."""
    if len(text) <= limit:
        return text, False
    already = text.endswith(CUT_MARK)
    body = text.removesuffix(CUT_MARK) if already else text
    return body[:limit] + CUT_MARK, not already


def comparison(
    verdicts: Sequence[TurnVerdict],
    *,
    judge: str,
    passed: bool,
    threshold: float,
    golden: str | None = None,
    limit: int = ANSWER_CHARS,
) -> tuple[Comparison, int]:
    """A comparison from the judge's per-turn verdicts, and how much of it was cut."""
    cut = max(0, len(verdicts) - MAX_TURNS)
    turns = []
    for verdict in sorted(verdicts, key=lambda v: v.turn)[:MAX_TURNS]:
        old, old_cut = _cut(verdict.expected, limit)
        new, new_cut = _cut(verdict.got, limit)
        cut += old_cut + new_cut
        turns.append(
            TurnAnswers(
                seq=verdict.turn,
                agreed=verdict.agreed,
                score=verdict.score,
                reason=verdict.reason,
                old=old,
                new=new,
            )
        )
    found = Comparison(
        golden=golden,
        judge=judge,
        passed=passed,
        compared=len(verdicts),
        agreed=sum(1 for v in verdicts if v.agreed),
        threshold=threshold,
        turns=turns,
    )
    return found, cut


def fitted(answers: Answers) -> str:
    """The document as JSON, its answers cut shorter until it fits in a ConfigMap."""
    text = answers.model_dump_json()
    limit = ANSWER_CHARS
    while len(text.encode()) > MAX_BYTES and limit > 100:
        limit //= 2
        cut = answers.cut
        comparisons = []
        for found in answers.comparisons:
            turns = []
            for turn in found.turns:
                old, old_cut = _cut(turn.old, limit)
                new, new_cut = _cut(turn.new, limit)
                cut += old_cut + new_cut
                turns.append(turn.model_copy(update={"old": old, "new": new}))
            comparisons.append(found.model_copy(update={"turns": turns}))
        answers = answers.model_copy(update={"comparisons": comparisons, "cut": cut})
        text = answers.model_dump_json()
    return text


def manifest(migration: dict[str, Any], answers: Answers) -> dict[str, Any]:
    meta = migration["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": names.validation_answers(meta["name"]),
            "namespace": meta["namespace"],
            "labels": {
                names.SESSION_LABEL: answers.session,
                names.MIGRATION_LABEL: names.label_value(meta["name"]),
                names.MANAGED_BY_LABEL: names.MANAGED_BY,
            },
            "ownerReferences": [
                {
                    "apiVersion": migration["apiVersion"],
                    "kind": migration["kind"],
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": False,
                }
            ],
        },
        "data": {ANSWERS_KEY: fitted(answers)},
    }


async def save(api: KubeApi, migration: dict[str, Any], answers: Answers) -> str:
    """Write (or rewrite) the migration's answers; the ConfigMap's name."""
    body = manifest(migration, answers)
    meta = body["metadata"]
    try:
        await api.create(namespaced("configmaps", meta["namespace"]), body)
    except AlreadyExists:
        await api.patch(
            namespaced("configmaps", meta["namespace"], meta["name"]), {"data": body["data"]}
        )
    return str(meta["name"])


async def load(api: KubeApi, namespace: str, migration: str) -> Answers | None:
    """The answers of ``migration``'s upgrade gate, if it kept any."""
    found = await api.get(namespaced("configmaps", namespace, names.validation_answers(migration)))
    if found is None or ANSWERS_KEY not in (found.get("data") or {}):
        return None
    return Answers.model_validate_json(found["data"][ANSWERS_KEY])
