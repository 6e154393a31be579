"""``shadowpod golden record`` and ``shadowpod golden replay`` as a user runs them."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from shadowpod.gates.golden import GoldenFile
from shadowpod.local.deployment import LocalDeployment
from shadowpod.local.images import reference_images
from tests.agent.support import post, wait_answered
from tests.gates.sessions import Recorded, record_in_own_loop


def shadowpod(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shadowpod", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    return record_in_own_loop(tmp_path_factory.mktemp("cli"))


def test_replay_passes_the_same_version_and_exits_0(recorded: Recorded) -> None:
    done = shadowpod(
        "golden", "replay", str(recorded.golden), "--image", "refagent:v2", "--judge", "exact"
    )
    assert done.returncode == 0, done.stderr
    assert "passed: 8/8 turns agree (100%) by the exact judge" in done.stdout


def test_replay_fails_a_reworded_version_under_the_exact_judge_and_shows_why(
    recorded: Recorded,
) -> None:
    done = shadowpod(
        "golden",
        "replay",
        str(recorded.golden),
        "--image",
        "refagent:v2-reworded",
        "--judge",
        "normalised",
        "--json",
    )
    assert done.returncode == 1, done.stderr
    verdict = json.loads(done.stdout)
    assert verdict["passed"] is False and verdict["judge"] == "normalised"
    reasons = [t["reason"] for t in verdict["turns"] if not t["agreed"]]
    assert any("pleased to meet you" in reason for reason in reasons)
    table = shadowpod(
        "golden", "replay", str(recorded.golden), "--image", "refagent:v2-reworded",
        "--judge", "exact",
    )  # fmt: skip
    assert table.returncode == 1
    assert "FAILED" in table.stdout and "worst disagreements" in table.stdout


def test_replay_says_what_is_wrong_with_what_it_was_given(
    recorded: Recorded, tmp_path: Path
) -> None:
    unknown = shadowpod("golden", "replay", str(recorded.golden), "--image", "refagent:v9")
    assert unknown.returncode == 2
    assert "image 'refagent:v9' is not in the local image map" in unknown.stderr
    missing = shadowpod("golden", "replay", str(tmp_path / "none.jsonl"), "--image", "refagent:v2")
    assert missing.returncode == 2 and "cannot read golden file" in missing.stderr
    policy = tmp_path / "policy.yaml"
    policy.write_text("judge: llm\n")
    bad_policy = shadowpod(
        "golden", "replay", str(recorded.golden), "--image", "refagent:v2", "--policy", str(policy)
    )
    assert bad_policy.returncode == 2
    assert "judge: llm needs an llm endpoint" in bad_policy.stderr
    assert "Traceback" not in unknown.stderr + missing.stderr + bad_policy.stderr


async def test_record_cuts_a_live_sessions_journal_into_a_golden_file(tmp_path: Path) -> None:
    async with LocalDeployment(tmp_path / "dep", reference_images()) as dep:
        await dep.create_session("s2", image="refagent:v1", instance="owner-1")
        async with dep.client() as client:
            seqs = [await post(client, "my name is Bo", "s2")]
            await wait_answered(dep.admin, seqs, "s2")
            seqs += [await post(client, text, "s2") for text in ("hi", "hey")]
        await wait_answered(dep.admin, seqs, "s2")
        token_file = tmp_path / "token"
        token_file.write_text(dep.gateway.control_token + "\n")
        output = tmp_path / "s2.jsonl"
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "shadowpod", "golden", "record",
            "--gateway", dep.gateway.url, "--token-file", str(token_file),
            "--session", "s2", "--from", str(seqs[1]), "-o", str(output),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        stdout, stderr = await process.communicate()
        assert process.returncode == 0, stderr.decode()
        assert "of s2, " in stdout.decode() and "2 inbound" in stdout.decode()
        golden = GoldenFile.read(output)
        # The slice starts at the second message; the name from before is in its base.
        assert golden.header.from_seq == seqs[1]
        assert golden.base.memory == {"name": "Bo"}
        assert dep.gateway.control_token not in output.read_text()
        unknown = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "shadowpod", "golden", "record",
            "--gateway", dep.gateway.url, "--token-file", str(token_file),
            "--session", "nope", "-o", str(tmp_path / "nope.jsonl"),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, stderr = await unknown.communicate()
        assert unknown.returncode == 2
        assert "cannot record nope" in stderr.decode() and "SessionNotFound" in stderr.decode()
