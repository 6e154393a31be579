"""The answers ConfigMap of an upgrade gate fits the API server's object limit however
long the agent's answers are, and says how much it cut."""

from __future__ import annotations

from shadowpod.gates.verdicts import TurnVerdict
from shadowpod.kube import answers, names


def verdicts(count: int, size: int) -> list[TurnVerdict]:
    return [
        TurnVerdict(
            turn=seq,
            agreed=seq % 2 == 0,
            score=0.5,
            reason="r",
            expected="o" * size,
            got="n" * size,
        )
        for seq in range(1, count + 1)
    ]


def test_long_answers_are_cut_until_the_document_fits_in_a_configmap() -> None:
    found, cut = answers.comparison(verdicts(400, 10_000), judge="exact", passed=False, threshold=1)
    assert found.compared == 400 and len(found.turns) == answers.MAX_TURNS
    assert cut == (400 - answers.MAX_TURNS) + 2 * answers.MAX_TURNS
    document = answers.Answers(
        migration="m",
        session="s",
        source_image="a",
        target_image="b",
        comparisons=[found],
        cut=cut,
    )
    text = answers.fitted(document)
    assert len(text.encode()) <= answers.MAX_BYTES
    kept = answers.Answers.model_validate_json(text)
    assert kept.cut == cut  # shorter still, the same answers cut
    assert max(len(t.old) for t in kept.comparisons[0].turns) < answers.ANSWER_CHARS
    assert kept.comparisons[0].turns[0].old.startswith("ooo")


def test_short_answers_are_kept_whole() -> None:
    found, cut = answers.comparison(verdicts(3, 50), judge="exact", passed=True, threshold=1)
    assert cut == 0 and [t.old for t in found.turns] == ["o" * 50] * 3


def test_a_long_migration_name_still_names_a_valid_configmap() -> None:
    name = names.validation_answers("m" * 253)
    assert len(name) <= 253 and name.endswith("-answers")
    assert names.validation_answers("ada-g2") == "ada-g2-answers"
