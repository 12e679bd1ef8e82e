"""The append-only audit logs: one write per record, shared by processes, torn lines skipped."""

import multiprocessing

from agentrl.engine.common.audit import AuditLog, episodes_audit_path, learner_audit_path, prompt_sha1, read_audit


def _writer(path: str, who: int, n: int) -> None:
    log = AuditLog(path)
    for i in range(n):
        log.append({"who": who, "i": i, "pad": "x" * 500})


def test_records_from_several_processes_stay_whole(tmp_path):
    path = tmp_path / "audit" / "episodes.jsonl"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(path), who, 200)) for who in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    records = read_audit(path)
    assert len(records) == 600  # no line lost or torn by the interleaving
    for who in range(3):
        assert [r["i"] for r in records if r["who"] == who] == list(range(200))  # each writer's order kept
    assert {r["pid"] for r in records} == {p.pid for p in procs}


def test_appends_never_rewrite_and_a_torn_line_is_skipped(tmp_path):
    path = tmp_path / "a.jsonl"
    log = AuditLog(path, fsync=True)
    log.append({"step": 1})
    with path.open("a") as f:
        f.write('{"step": 2, "samp')  # a writer killed mid-line
    AuditLog(path).append({"step": 3})  # a resumed run ends the torn line, then appends
    assert [r.get("step") for r in read_audit(path)] == [1, 3]
    assert '{"step": 2, "samp\n' in path.read_text()  # nothing was overwritten
    assert read_audit(tmp_path / "missing.jsonl") == []


def test_prompt_digest_covers_the_tokens_before_the_first_trained_one():
    a = prompt_sha1([1, 2, 3, 9, 9], [0, 0, 0, 1, 1])
    assert a == prompt_sha1([1, 2, 3, 7], [0, 0, 0, 1])  # same prompt, other answer
    assert a != prompt_sha1([1, 2, 4, 9, 9], [0, 0, 0, 1, 1])
    assert a != prompt_sha1([1, 2, 3, 9, 9], [0, 0, 1, 1, 1])  # the prompt ends elsewhere
    assert len(a) == 16 and int(a, 16) >= 0
    assert prompt_sha1([1, 2], [0, 0]) == prompt_sha1([1, 2], [0, 0])


def test_paths_inside_the_run_directory(tmp_path):
    assert learner_audit_path(tmp_path) == tmp_path / "audit" / "learner.jsonl"
    assert episodes_audit_path(tmp_path) == tmp_path / "audit" / "episodes.jsonl"
