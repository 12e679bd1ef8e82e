"""The bisection's search (no run): the first commit that differs, failed commits stepped over."""

from pathlib import Path

from benchmarks.bisect_outcome import bisect, overrides_for


def _verdicts(first_differs: int, failed: set[int] = frozenset()):
    asked: list[int] = []

    def verdict(rev: str) -> str:
        i = int(rev)
        asked.append(i)
        return "failed" if i in failed else ("differs" if i >= first_differs else "same")

    return verdict, asked


def test_the_first_commit_that_differs_is_found_in_log2_runs() -> None:
    commits = [str(i) for i in range(65)]
    for first in (1, 2, 17, 40, 63, 64):
        verdict, asked = _verdicts(first)
        found, skipped = bisect(commits, verdict)
        assert commits[found] == str(first) and skipped == []
        assert len(asked) <= 6  # 63 commits between the ends


def test_a_commit_whose_run_fails_is_stepped_over_to_its_neighbour() -> None:
    commits = [str(i) for i in range(33)]
    verdict, _ = _verdicts(20, failed={16, 20})
    found, skipped = bisect(commits, verdict)
    # 20 itself failed: the first that differs among those that ran is 21, and 20 is named as possibly first
    assert commits[found] == "21" and skipped == [20]
    verdict, _ = _verdicts(9, failed={16})
    assert bisect(commits, verdict) == (9, [])


def test_a_key_is_set_only_where_its_file_exists(tmp_path: Path) -> None:
    (tmp_path / "agentrl").mkdir()
    (tmp_path / "agentrl" / "placement_plan.py").write_text("")
    where = ['agentrl/placement_plan.py:placement.mode="separate"', 'agentrl/nothing.py:x.y=1']
    assert overrides_for(tmp_path, ["mode=sync"], where) == ["mode=sync", 'placement.mode="separate"']


def test_losses_agree_bit_for_bit_or_within_the_tolerance() -> None:
    from benchmarks.bisect_outcome import agree

    assert agree([0.5, 0.25], [0.5, 0.25], 0.0) and not agree([0.5, 0.25], [0.5, 0.25 + 1e-9], 0.0)
    assert agree([0.5, 0.25], [0.5, 0.25 + 1e-9], 1e-6) and not agree([0.5, 0.25], [0.5, 0.26], 1e-6)
    assert not agree([0.5], [0.5, 0.25], 1.0)  # a run that stopped early is not the same run
