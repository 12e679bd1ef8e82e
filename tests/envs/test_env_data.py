import json
import re
from fractions import Fraction
from pathlib import Path

import pytest

from agentrl.envs.calc import generate_problems
from agentrl.envs.data import SYNTHETIC_DEFAULT_ROWS, is_local_source, load_rows
from agentrl.errors import DataError


def test_synthetic_calc() -> None:
    rows = load_rows("synthetic:calc", limit=10, seed=3)
    assert rows == generate_problems(10, 3)
    assert len(load_rows("synthetic:calc")) == SYNTHETIC_DEFAULT_ROWS
    test_rows = load_rows("synthetic:calc", split="test", limit=10, seed=3)
    assert test_rows != rows and test_rows == load_rows("synthetic:calc", split="test", limit=10, seed=3)


def test_unknown_synthetic_task() -> None:
    with pytest.raises(DataError, match="unknown synthetic task .nope. \\(known: .calc., .turns., .linear., .word., .math., .math_ood., "):
        load_rows("synthetic:nope")


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_with_field_mapping(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [{"problem": "Compute 1*2+3.", "solution": "5", "id": 1}, {"problem": "p2", "solution": "7", "id": 2}],
    )
    rows = load_rows(str(path), fields={"question": "problem", "answer": "solution"})
    assert rows[0] == {"problem": "Compute 1*2+3.", "solution": "5", "id": 1, "question": "Compute 1*2+3.", "answer": "5"}
    assert len(rows) == 2
    assert len(load_rows(str(path), fields={"question": "problem", "answer": "solution"}, limit=1)) == 1


def test_json_and_parquet(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = [{"question": "q1", "answer": "1"}, {"question": "q2", "answer": "2"}]
    (tmp_path / "d.json").write_text(json.dumps(data))
    assert load_rows(str(tmp_path / "d.json")) == data
    pq.write_table(pa.Table.from_pylist(data), tmp_path / "d.parquet")
    assert load_rows(str(tmp_path / "d.parquet")) == data


def test_missing_field_names_file_and_row(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [{"question": "q", "answer": "1"}, {"question": "q2"}])
    with pytest.raises(DataError, match=r"bad\.jsonl: row 2 \(line 2\): field 'answer' is missing; its fields with values: \['question'\]"):
        load_rows(str(path))
    with pytest.raises(DataError, match=r"row 1 \(line 1\): field 'question' \(mapped from column 'problem'\) is missing"):
        load_rows(str(path), fields={"question": "problem"})


def test_a_null_field_is_named_null_and_not_listed_as_present(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "null.jsonl", [{"question": "q", "answer": "1"}, {}, {"question": "q2", "answer": None}][::2])
    with pytest.raises(DataError, match=r"null\.jsonl: row 2 \(line 2\): field 'answer' is null; its fields with values: \['question'\] \(null: \['answer'\]\)"):
        load_rows(str(path))


def test_rows_count_from_one_in_every_format(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_text("question,answer\nq1,1\nq2,\n")
    (tmp_path / "d.json").write_text(json.dumps([{"question": "q", "answer": None}]))
    with pytest.raises(DataError, match=r"d\.json: row 1: field 'answer' is null"):
        load_rows(str(tmp_path / "d.json"))
    assert load_rows(str(tmp_path / "d.csv"))[1]["answer"] == ""  # CSV has no null: an empty string


def test_a_broken_json_line_names_the_file_and_the_line(tmp_path: Path) -> None:
    (tmp_path / "broken.jsonl").write_text('{"question": "q", "answer": "1"}\n\n{not json\n')
    with pytest.raises(DataError, match=r"broken\.jsonl: line 3: not valid JSON"):
        load_rows(str(tmp_path / "broken.jsonl"))
    (tmp_path / "broken.json").write_text('[{"question": "q",\n "answer": }]')
    with pytest.raises(DataError, match=r"broken\.json: line 2, column \d+: not valid JSON"):
        load_rows(str(tmp_path / "broken.json"))


def test_missing_and_unsupported_files(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"missing\.jsonl: no such data file"):
        load_rows(str(tmp_path / "missing.jsonl"))
    with pytest.raises(DataError, match=r"missing\.csv: no such data file"):  # a CSV is a file, present or not
        load_rows(str(tmp_path / "missing.csv"))
    (tmp_path / "d.txt").write_text("question,answer\nq,1\n")
    with pytest.raises(DataError, match=r"unsupported data file type '\.txt' \(use \.jsonl, \.json, \.csv, \.parquet\)"):
        load_rows(str(tmp_path / "d.txt"))
    (tmp_path / "noext").write_text("{}")
    with pytest.raises(DataError, match=r"noext: unsupported data file type '\(no suffix\)'"):
        load_rows(str(tmp_path / "noext"))


def test_csv_and_parquet_by_suffix(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "d.csv").write_text("question,answer\nq1,1\nq2,2\n")
    assert load_rows(str(tmp_path / "d.csv")) == [{"question": "q1", "answer": "1"}, {"question": "q2", "answer": "2"}]
    pq.write_table(pa.Table.from_pylist([{"question": "q", "answer": None}]), tmp_path / "n.parquet")
    with pytest.raises(DataError, match=r"n\.parquet: row 1: field 'answer' is null"):
        load_rows(str(tmp_path / "n.parquet"))


@pytest.mark.parametrize("source", ["./data/train", "data/sets/train", "/no/such/file", "~/nope", "train.txt"])
def test_a_path_spelled_locally_is_never_a_hub_dataset(source: str, monkeypatch) -> None:
    import datasets

    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("the Hub was asked"))
    assert is_local_source(source)
    with pytest.raises(DataError, match="no such data file"):
        load_rows(source)


@pytest.mark.parametrize("source", ["gsm8k", "openai/gsm8k", "openai/gsm8k:main"])
@pytest.mark.parametrize("why", ["flag", "unreachable"])
def test_offline_a_hub_name_reads_the_cache_only_and_says_so(source: str, why: str, monkeypatch) -> None:
    import datasets
    import huggingface_hub.constants

    import agentrl.models.loading

    calls = []

    def load_dataset(*args, **kwargs):  # as datasets does offline for a dataset it has not cached
        calls.append((args, datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE))
        raise ConnectionError("Couldn't reach the Hub (offline mode is enabled)")

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    if why == "flag":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        monkeypatch.setattr(agentrl.models.loading, "hub_reachable", lambda timeout=3.0: False)
    assert not is_local_source(source)
    said = "HF_HUB_OFFLINE is set" if why == "flag" else "the Hugging Face Hub is not reachable from here"
    with pytest.raises(DataError, match=rf"no such local file, and not in the Hugging Face cache while offline \({said}\)"):
        load_rows(source)
    [(args, datasets_offline, hub_offline)] = calls  # one call, in offline mode: no retries over the network
    assert args[0] == source.partition(":")[0] and datasets_offline and hub_offline
    assert not datasets.config.HF_HUB_OFFLINE or why == "flag"  # the switches are put back


def test_offline_a_cached_hub_dataset_still_loads(monkeypatch) -> None:
    import datasets

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    table = datasets.Dataset.from_list([{"question": "q", "answer": "1"}])
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: table)
    assert load_rows("owner/cached") == [{"question": "q", "answer": "1"}]


def test_rows_of_chat_messages_are_prompts(tmp_path: Path) -> None:
    conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Compute 1*2+3."}]
    path = write_jsonl(tmp_path / "chat.jsonl", [{"messages": conv, "answer": "5"}, {"messages": conv[:1], "answer": "1"}])
    with pytest.raises(DataError, match=r"chat\.jsonl: row 2 \(line 2\): field 'messages' has no user message \(roles: \['system'\]\)"):
        load_rows(str(path))
    [row] = load_rows(str(path), limit=1)
    assert row == {"messages": conv, "answer": "5", "question": "Compute 1*2+3."}
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"messages": "hi", "answer": "1"}])
    with pytest.raises(DataError, match=r"row 1 \(line 1\): field 'messages' must be a non-empty list"):
        load_rows(str(bad))
    none = write_jsonl(tmp_path / "none.jsonl", [{"answer": "1"}])
    with pytest.raises(DataError, match=r"field 'question' is missing.*a row's prompt is a 'question' or a 'messages' conversation"):
        load_rows(str(none))


@pytest.mark.parametrize("task", ["linear", "word"])
def test_synthetic_math_tasks(task: str) -> None:
    rows = load_rows(f"synthetic:{task}", limit=40, seed=1)
    assert len(rows) == 40 and rows == load_rows(f"synthetic:{task}", limit=40, seed=1)
    assert rows != load_rows(f"synthetic:{task}", limit=40, seed=2)
    assert rows != load_rows(f"synthetic:{task}", split="test", limit=40, seed=1)
    assert all(r["task"] == task and r["question"] and r["answer"] for r in rows)


def test_linear_answers_solve_the_equations() -> None:
    """Independently of the generator: parse the question text and solve it with sympy."""
    import sympy

    x = sympy.Symbol("x")
    rows = load_rows("synthetic:linear", limit=60, seed=4)
    assert any("/" in r["answer"] for r in rows) and any("/" not in r["answer"] for r in rows)
    for row in rows:
        eq = row["question"].removeprefix("Solve for x: ").removesuffix(".")
        lhs, rhs = (re.sub(r"(\d)x", r"\1*x", side) for side in eq.split(" = "))
        assert sympy.solve(sympy.Eq(sympy.sympify(lhs), sympy.sympify(rhs)), x) == [sympy.Rational(row["answer"])], row


def test_word_answers_are_exact() -> None:
    """Reduced fractions, and each one solves its question (read from the text alone)."""
    rows = load_rows("synthetic:word", limit=200, seed=0)
    kinds = {r["question"].split(" ")[1] for r in rows}
    assert len(kinds) > 3
    for row in rows:
        value = Fraction(row["answer"])
        assert str(value) == row["answer"]  # reduced
        assert value == _solve_word_problem(row["question"]), row  # the answer solves the question
        if "change" in row["question"]:
            assert value >= 0


def _solve_word_problem(q: str) -> Fraction:
    """The answer of a synthetic word problem, read from its text alone (independently of the
    generator's own arithmetic)."""
    if m := re.search(r"buys (\d+) .+? at (\d+) dollars each and a pen for (\d+) dollars\. .+? pays with a (\d+)-dollar bill", q):
        k, price, extra, bill = map(int, m.groups())
        return Fraction(bill - k * price - extra)
    if m := re.search(r"has (\d+) .+? and gives (\d+) to each of (\d+) friends", q):
        start, each, friends = map(int, m.groups())
        return Fraction(start - each * friends)
    if m := re.search(r"at a constant (\d+) kilometres per hour for (\d+) hours and (\d+) minutes", q):
        speed, hours, minutes = map(int, m.groups())
        return speed * (hours + Fraction(minutes, 60))
    if m := re.search(r"is (\d+) times as old as .+?, who is (\d+) years old\. How old will .+? be in (\d+) years", q):
        factor, child, years = map(int, m.groups())
        return Fraction(factor * child + years)
    if m := re.search(r"holds (\d+) marbles\. .+? takes (\d+)/(\d+) of them, then puts 3 back", q):
        whole, num, den = map(int, m.groups())
        return whole - whole * Fraction(num, den) + 3
    raise AssertionError(f"no template matches {q!r}")


def test_synthetic_rows_feed_the_math_envs() -> None:
    import anyio

    from agentrl.envs import MathEnv

    env = MathEnv()
    for row in load_rows("synthetic:word", limit=3) + load_rows("synthetic:linear", limit=3):
        env.reset(options={"row": row})
        answer = row["answer"]
        latex = answer if "/" not in answer else "\\frac{%s}{%s}" % tuple(answer.split("/"))
        assert anyio.run(env.astep, f"\\boxed{{{latex}}}")[1] == 1.0


CHAT = [
    {"role": "system", "content": "Answer in one number."},
    {"role": "user", "content": "Compute 1+1."},
    {"role": "assistant", "content": "2"},
    {"role": "user", "content": "Compute 2*3+1."},
]


def test_a_final_assistant_turn_is_the_reference_answer_not_the_prompt(tmp_path: Path) -> None:
    """TRL's conversational rows: the prompt is the conversation up to and excluding a final
    assistant turn, which serves as the answer when the row has none; in every file format."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"messages": [*CHAT, {"role": "assistant", "content": "7"}]},
            {"messages": [*CHAT, {"role": "assistant", "content": "seven"}], "answer": "7"},
            {"messages": CHAT, "answer": "7"}]
    expected = {"messages": CHAT, "answer": "7", "question": "Compute 2*3+1."}
    write_jsonl(tmp_path / "chat.jsonl", rows)
    (tmp_path / "chat.json").write_text(json.dumps(rows))
    pq.write_table(pa.Table.from_pylist([{"answer": None, **r} for r in rows]), tmp_path / "chat.parquet")  # a table's null
    for name in ("chat.jsonl", "chat.json", "chat.parquet"):
        loaded = load_rows(str(tmp_path / name))
        assert [{k: r[k] for k in expected} for r in loaded] == [expected] * 3, name
    assert rows[0]["messages"][-1]["content"] == "7"  # the file's rows are not changed in place
    only = write_jsonl(tmp_path / "only.jsonl", [{"messages": [{"role": "system", "content": "s"}, {"role": "assistant", "content": "7"}]}])
    with pytest.raises(DataError, match=r"only\.jsonl: row 1 \(line 1\): field 'messages' has no user message before its final assistant turn \(roles: \['system', 'assistant'\]\)"):
        load_rows(str(only))
    open_ended = write_jsonl(tmp_path / "open.jsonl", [{"messages": CHAT}])
    with pytest.raises(DataError, match=r"open\.jsonl: row 1 \(line 1\): field 'answer' is missing.*nor do its 'messages' end with an assistant turn"):
        load_rows(str(open_ended))


@pytest.mark.parametrize(("message", "said"), [
    ({"role": "user"}, r"messages\[1\]: 'content' is missing \(its keys: \['role'\]\)"),
    ({"role": "user", "content": None}, r"messages\[1\]: 'content' is null"),
    ({"role": 3, "content": "hi"}, r"messages\[1\]: 'role' must be a string, got int '3'"),
    ({"content": "hi"}, r"messages\[1\]: 'role' is missing"),
    ("hi", r"messages\[1\]: expected an object with 'role' and 'content', got str 'hi'"),
])
def test_a_malformed_message_names_the_file_the_row_and_the_key(tmp_path: Path, message, said: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    good = {"messages": CHAT, "answer": "7"}
    path = write_jsonl(tmp_path / "chat.jsonl", [good, {"messages": [CHAT[0], message], "answer": "1"}])
    with pytest.raises(DataError, match=r"chat\.jsonl: row 2 \(line 2\): " + said):
        load_rows(str(path))
    if isinstance(message, dict) and all(isinstance(v, str) or v is None for v in message.values()):  # a table holds it
        pq.write_table(pa.Table.from_pylist([good, {"messages": [CHAT[0], {"role": None, "content": None, **message}], "answer": "1"}]),
                       tmp_path / "chat.parquet")
        with pytest.raises(DataError, match=r"chat\.parquet: row 2: messages\[1\]: '(role|content)' is null"):
            load_rows(str(tmp_path / "chat.parquet"))


def test_a_tool_env_starts_from_the_rows_conversation(tmp_path: Path) -> None:
    """The prompt conversation reaches the model: the row's system message after the
    environment's own system prompt (with its tools), the earlier turns in order, the last user
    message as user_message gives it; a final assistant turn never does."""
    from agentrl.envs.tool_env import ToolEnv

    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: the first addend.
            b: the second addend.
        """
        return a + b

    class AdderEnv(ToolEnv):
        tools = [add]
        system_prompt = "Use the tools."

        def reward(self, action: str, row: dict) -> float:
            return float(action.strip() == str(row["answer"]))

    path = write_jsonl(tmp_path / "chat.jsonl", [{"messages": [*CHAT, {"role": "assistant", "content": "7"}]}, {"question": "Compute 4+4.", "answer": "8"}])
    chat_row, plain_row = load_rows(str(path))
    env = AdderEnv()
    messages, _ = env.reset(options={"row": chat_row})
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[0]["content"].startswith("Use the tools.") and "add" in messages[0]["content"]
    assert messages[0]["content"].endswith("\n\nAnswer in one number.")
    assert messages[1:] == CHAT[1:]
    assert env.observation_space.contains(messages)
    _, reward, terminated, _, _ = env.step("7")
    assert terminated and reward == 1.0  # scored against the final assistant turn
    messages, _ = env.reset(options={"row": plain_row})
    assert [m["role"] for m in messages] == ["system", "user"] and messages[1]["content"] == "Compute 4+4."

    class ShoutEnv(AdderEnv):
        def user_message(self, row: dict) -> str:
            return str(row["question"]).upper()

    messages, _ = ShoutEnv().reset(options={"row": chat_row})
    assert [m["content"] for m in messages[1:]] == ["Compute 1+1.", "2", "COMPUTE 2*3+1."]


def test_the_docs_conversational_row_loads_as_the_docs_say(tmp_path: Path) -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "environments.md").read_text()
    match = re.search(r"`data/chat\.jsonl`:\s*```json\n(.*?)```", doc, re.DOTALL)
    assert match is not None, "docs/environments.md lost its conversational row example"
    (tmp_path / "chat.jsonl").write_text(match.group(1))
    [row] = load_rows(str(tmp_path / "chat.jsonl"))
    assert [m["role"] for m in row["messages"]] == ["system", "user"] and row["answer"] == "42"


def test_a_hub_dataset_loads_without_datasets_progress_bars(monkeypatch) -> None:
    """datasets' own bars ("Generating train split") are off while a Hub dataset loads, and as
    they were after it."""
    import datasets

    seen = []

    def load_dataset(*args, **kwargs):
        seen.append(datasets.are_progress_bars_disabled())
        return datasets.Dataset.from_list([{"question": "q", "answer": "1"}])

    import sys

    bars = sys.modules["datasets.utils.tqdm"]  # on, whatever this process's environment said at import
    monkeypatch.setattr(bars, "HF_DATASETS_DISABLE_PROGRESS_BARS", None)
    monkeypatch.setattr(bars, "_hf_datasets_progress_bars_disabled", False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    assert load_rows("owner/cached") == [{"question": "q", "answer": "1"}]
    assert seen == [True] and not datasets.are_progress_bars_disabled()
