"""Known-issue entries: an entry excuses the evidence it names (an error by its text; a wrong result check by check,
subject by subject, within its band), across diffusers releases, and a bad entry is refused naming itself."""

from pathlib import Path

import pytest

from harness.core import axes, compat
from harness.core.errors import HarnessError
from harness.core.evidence import Evidence
from harness.core.layouts import parse_layout
from harness.core.records import Case
from harness.core.results import CaseResult, Status
from harness.run.known_issues import Excuse, KnownIssue, load_known_issues
from harness.run.verdict import apply_known_issues, base_result, settle

REPOSITORY_FILE = Path(__file__).resolve().parents[2] / "known_issues.toml"
OLD_FLASH = "ValueError: `attn_mask` is not supported for aiter attention"
NEW_FLASH = "ValueError: `attn_mask` is not supported for native flash attention"


def _result(items, case_id="flux/tp2/native/fp32/train"):
    values = axes.parse(case_id)
    result = base_result(Case(**{**values, "layout": parse_layout(values["layout"])}))
    return settle(result, items)


def _error(text):
    return Evidence("error", text)


def _grad(name, value, limit=1e-4):
    return Evidence("grad_rel", f"gradient of {name} (rel L2 err) {value:.3g} > {limit:.3g}", name, value, limit)


NORMS = KnownIssue("*/tp*/*/*/train", "per-head norms", status="FAIL", key="test #1",
                   evidence={"grad_rel": Excuse(("*.norm_q.weight", "*.norm_k.weight"), (0.5, 1.0))})


def test_any_of_a_list_of_texts_excuses_an_error():
    issue = KnownIssue("*@masked/*/_native_flash/*/*", "no mask", error_contains=("native flash", "aiter attention"))
    assert issue.excuses(_error(NEW_FLASH)) and issue.excuses(_error(OLD_FLASH))
    assert not issue.excuses(_error("RuntimeError: something else"))


def test_a_version_range_limits_the_entry_to_its_releases():
    issue = KnownIssue("*", "old wording", error_contains="aiter attention", diffusers=">=0.37,<0.40")
    case_id = "flux/tp2/native/fp32/tensor"
    assert issue.applies(case_id, version="0.38.0")
    assert not issue.applies(case_id, version="0.40.0") and not issue.applies(case_id, version="0.36.0")
    assert KnownIssue("*", "r", diffusers="<0.44").covers("0.43.0.dev0")  # a source install of main counts


def test_the_range_is_checked_against_the_installed_diffusers(monkeypatch):
    issue = KnownIssue("*", "old release only", error_contains="boom", diffusers="<0.39")
    monkeypatch.setattr(compat, "installed_version", lambda: "0.42.1")
    assert apply_known_issues(_result([_error("ValueError: boom")]), [issue]).status is Status.ERROR
    monkeypatch.setattr(compat, "installed_version", lambda: "0.38.0")
    assert apply_known_issues(_result([_error("ValueError: boom")]), [issue]).status is Status.XFAIL


def test_every_failed_check_excused_is_xfail():
    result = apply_known_issues(_result([_grad("a.norm_q.weight", 0.9), _grad("a.norm_k.weight", 0.6)]), [NORMS])
    assert result.status is Status.XFAIL and result.reason.startswith("known issue: per-head norms; observed ")
    assert [item["known"] for item in result.evidence] == ["test #1", "test #1"]


def test_a_second_bug_beside_the_known_one_is_fail_naming_it():
    """The known issue covers the norm weights; the embedder's gradient is another bug and must stay visible."""
    items = [_grad("a.norm_q.weight", 0.9), _grad("x_embedder.weight", 0.02)]
    result = apply_known_issues(_result(items), [NORMS])
    assert result.status is Status.FAIL
    assert result.reason.startswith("gradient of x_embedder.weight (rel L2 err) 0.02 > 0.0001; also known: "
                                    "gradient of a.norm_q.weight")
    assert [item.get("known") for item in result.evidence] == ["test #1", None]


@pytest.mark.parametrize("item", [
    _grad("a.norm_q.weight", 0.2),  # another size: another bug
    Evidence("weight_abs", "weights of a.norm_q.weight 0.01 > 0.001", "a.norm_q.weight", 0.01, 1e-3),  # another check
    Evidence("loss_rel", "loss: rel err 3e-4 > 1e-5", "", 3e-4, 1e-5),
    _error("RuntimeError: the ranks disagree"),  # an error is not a wrong result
    Evidence("proof.function", "requested native, but _native_flash ran", "native"),  # never excused
])
def test_what_the_entry_does_not_name_stays_a_failure(item):
    before = _result([item]).status
    assert before in (Status.FAIL, Status.ERROR)
    assert apply_known_issues(_result([item]), [NORMS]).status is before


def test_a_negative_control_answers_to_the_entries_of_its_case():
    """The injected case's id carries `+fault`: it is judged by its case's entries, so only the fault is left."""
    items = [_grad("a.norm_q.weight", 0.9), _grad("x_embedder.weight", 0.02)]
    result = apply_known_issues(_result(items, "flux/tp2/native/fp32/train+tp_colwise_input_grad"), [NORMS])
    assert result.status is Status.FAIL and result.reason.startswith("gradient of x_embedder.weight")


def test_a_listed_case_that_passes_is_xpass():
    result = apply_known_issues(_result([]), [NORMS])
    assert result.status is Status.XPASS and "no longer reproduces" in result.reason
    assert result.known_issues == [{"key": "test #1", "title": "per-head norms", "link": "",
                                    "severity": "silently wrong"}]


LINKED = KnownIssue("*/tp*/*/*/train", "per-head norms act on sharded heads: nothing sums their gradients",
                    link="https://example.org/tensor_parallel.py#L12", status="FAIL", key="test #3",
                    title="tensor parallelism: wrong QK-norm gradients",
                    evidence={"grad_rel": Excuse(("*.norm_q.weight",), (0.5, 1.0)), "loss_rel": Excuse((), None)})


def test_an_xfail_carries_its_entry_title_link_and_the_band_each_figure_sat_in():
    """What a view needs to name an XFAIL is in the result: each entry that excused it (key, title, link) and, on each
    excused item, its entry's key and the measured band its figure lay in (none where the entry has no band)."""
    items = [_grad("a.norm_q.weight", 0.9), Evidence("loss_rel", "loss text", value=3e-4, limit=1e-5)]
    result = apply_known_issues(_result(items), [LINKED])
    assert result.status is Status.XFAIL
    assert result.known_issues == [{"key": "test #3", "title": "tensor parallelism: wrong QK-norm gradients",
                                    "link": "https://example.org/tensor_parallel.py#L12", "severity": "silently wrong"}]
    assert [(item["known"], item.get("band")) for item in result.evidence] == [("test #3", [0.5, 1.0]),
                                                                                ("test #3", None)]
    assert CaseResult.from_dict(result.to_dict()).known_issue("test #3")["title"].startswith("tensor parallelism")


def test_an_entry_without_a_title_is_named_by_its_reason_first_clause():
    """A title is optional (an entry of a user's file): the reason's first clause names it, as `short` always did;
    an excused error carries no band."""
    entry = KnownIssue("*", "no mask here: a long story; and more", error_contains="mask", key="test #4")
    result = apply_known_issues(_result([_error("ValueError: mask")]), [entry])
    assert result.known_issues == [{"key": "test #4", "title": "no mask here", "link": "", "severity": "crash"}]
    assert result.evidence == [{"check": "error", "text": "ValueError: mask", "known": "test #4"}]
    assert entry.short == "no mask here [test #4]" and LINKED.short.startswith("tensor parallelism: wrong")


def test_a_fail_with_a_known_part_names_only_the_entries_it_used():
    """A second bug beside the known one stays FAIL, and the result names the entry that excused the rest."""
    result = apply_known_issues(_result([_grad("a.norm_q.weight", 0.9), _grad("x_embedder.weight", 0.02)]), [LINKED])
    assert result.status is Status.FAIL and [entry["key"] for entry in result.known_issues] == ["test #3"]
    assert [item.get("band") for item in result.evidence] == [[0.5, 1.0], None]


def test_load_lists_ranges_and_evidence(tmp_path):
    path = tmp_path / "known.toml"
    path.write_text('[[issue]]\nmatch = "*"\nreason = "r"\nerror_contains = ["a", "b"]\ndiffusers = ">=0.37"\n\n'
                    '[[issue]]\nmatch = "*/tp2/*"\ntitle = "QK norms"\nreason = "norms"\n[issue.evidence.grad_rel]\n'
                    'subjects = ["*.norm_q.weight"]\nband = [0.5, 1.0]\n[issue.evidence.max_abs_err]\n'
                    'band = [0.1, 0.2]\ncontains = "max abs"\n')
    error, wrong = load_known_issues(path)
    assert error.error_contains == ("a", "b") and error.diffusers == ">=0.37" and error.status == "ERROR"
    assert error.title == "" and error.heading == "r" and wrong.title == wrong.heading == "QK norms"
    assert wrong.status == "FAIL" and wrong.key == "known.toml #2"
    assert wrong.evidence == {"grad_rel": Excuse(("*.norm_q.weight",), (0.5, 1.0)),
                              "max_abs_err": Excuse((), (0.1, 0.2), "max abs")}


def test_an_entry_carries_its_upstream_thread_to_its_results(tmp_path):
    """`upstream` names the issue or pull request; a result's reference of the entry carries it, and an entry
    without one (the control) carries no such key."""
    path = tmp_path / "known.toml"
    url = "https://github.com/huggingface/diffusers/pull/12563"
    path.write_text(f'[[issue]]\nmatch = "*"\nreason = "r"\nerror_contains = "x"\nupstream = "{url}"\n\n'
                    '[[issue]]\nmatch = "*"\nreason = "r"\nerror_contains = "y"\n')
    threaded, plain = load_known_issues(path)
    assert threaded.reference()["upstream"] == url and "upstream" not in plain.reference()


def test_a_refusal_entry_makes_its_cases_refused_and_a_crash_beside_it_keeps_them_xfail(tmp_path):
    """An entry's `severity` says what kind of finding it is (a FAIL entry silently wrong, an ERROR entry a crash
    unless it says): a case every excusing entry of which is a refusal is REFUSED, its reason an expected refusal; the
    same error excused by a crash entry as well is XFAIL, the worse kind (the control)."""
    path = tmp_path / "known.toml"
    path.write_text('[[issue]]\nmatch = "*"\nreason = "no lse"\nerror_contains = "lse"\nseverity = "refusal"\n\n'
                    '[[issue]]\nmatch = "*"\nreason = "boom"\nerror_contains = "boom"\n\n'
                    '[[issue]]\nmatch = "*"\nreason = "norms"\n[issue.evidence.loss_rel]\nband = [0, 1]\n')
    refusal, crash, wrong = load_known_issues(path)
    assert (refusal.finding, crash.finding, wrong.finding) == ("refusal", "crash", "silently wrong")
    refused = apply_known_issues(_result([_error("ValueError: no lse")]), [refusal, crash])
    assert refused.status is Status.REFUSED and refused.reason.startswith("expected refusal: no lse")
    assert refused.severity == "refusal" and refused.known_issues[0]["severity"] == "refusal"
    both = apply_known_issues(_result([_error("ValueError: no lse"), _error("RuntimeError: boom")]), [refusal, crash])
    assert both.status is Status.XFAIL and both.severity == "crash" and both.reason.startswith("expected refusal")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('error_contains = "x"\nseverity = "bad"', "'severity' must be one of 'silently wrong', 'crash', 'hang'"),
        ('severity = "refusal"\n[issue.evidence.loss_rel]\nband = [0, 1]', "a refusal is an error diffusers raises"),
        ('error_contains = "x"\ndiffusers = "0.38 or later"', r"'diffusers' = '0.38 or later' is not a version range"),
        ("error_contains = 3", "'error_contains' must be a string or a list of strings, not int"),
        ("error_contains = []", "'error_contains' must be a string or a non-empty list"),
        ('error_contains = ["a", ""]', "'error_contains' must be a string or a non-empty list of non-empty"),
        ('error_contains = "x"\ndiffusers = 0.38', "'diffusers' must be a string"),
        ('error_contains = "x"\ntitle = ["a"]', "'title' must be a string"),
        ('error_contains = "x"\nupstream = "javascript:alert(1)"', "'upstream' must be the https:// address"),
        ('error_contains = "x"\nversion = ">=0.38"', r"unknown keys \['version'\]; valid keys: diffusers"),
        ('status = "ERROR"', "needs 'error_contains'"),
        ('status = "FAIL"', r"needs at least one \[issue.evidence.<check>\] table"),
        ('status = "FAIL"\nerror_contains = "gradient"', "not 'error_contains'"),
        ('[issue.evidence.grad_rel]\nband = [0.5, 1.0]', "needs 'subjects': the parameters"),
        ('[issue.evidence.grad_rel]\nsubjects = ["*.norm_q.weight"]', r"needs 'band': the measured \[low, high\]"),
        ('[issue.evidence.max_abs_err]\nband = [0.4, 0.2]', r"needs 'band'"),
        ('[issue.evidence.gradients]\nband = [0.4, 0.5]', "unknown check; valid checks: .*grad_rel"),
        ('[issue.evidence."proof.function"]\nband = [0.4, 0.5]', "unknown check"),
        ('[issue.evidence.max_abs_err]\nband = [0.1, 0.2]\nglobs = ["x"]',
         "valid keys are band, contains, limit, subjects"),
    ],
)
def test_a_bad_entry_names_the_file_and_the_entry(tmp_path, body, message):
    path = tmp_path / "known.toml"
    path.write_text(f'[[issue]]\nmatch = "a"\nreason = "r"\nerror_contains = "x"\n\n[[issue]]\nmatch = "flux/*"\n'
                    f'reason = "r"\n{body}\n')
    with pytest.raises(HarnessError, match=message) as raised:
        load_known_issues(path)
    assert f"{path}: [[issue]] #2 ('flux/*')" in str(raised.value)


def test_every_repository_entry_names_its_evidence():
    """Each entry a title and a link to its traced cause; an ERROR entry its error's text; a FAIL entry its checks,
    each with a band, and subjects where the check has them (the loader refuses anything less; this reads the file
    the project ships)."""
    from harness.kinds import known_checks

    issues, checks = load_known_issues(REPOSITORY_FILE), known_checks()
    assert issues and all(issue.reason for issue in issues)
    assert all(issue.title and len(issue.title) <= 80 for issue in issues), [i.key for i in issues if not i.title]
    assert all(issue.link.startswith("https://github.com/") for issue in issues), [i.key for i in issues
                                                                                   if not i.link]
    assert all(issue.error_contains for issue in issues if issue.status == "ERROR")
    failing = [issue for issue in issues if issue.status == "FAIL"]
    assert len(failing) >= 4 and all(issue.evidence for issue in failing)
    assert all(excuse.band or not checks[check].figure for issue in failing
               for check, excuse in issue.evidence.items())
    assert all(excuse.subjects or not checks[check].subjects for issue in failing
               for check, excuse in issue.evidence.items())


def test_repository_native_flash_mask_entry_knows_each_release_wording():
    issues = load_known_issues(REPOSITORY_FILE)
    case_id = "qwenimage@masked/ulysses2/_native_flash/bf16/tensor"
    listed = [issue for issue in issues if issue.applies(case_id, version="0.38.0")]
    assert any(issue.excuses(_error(OLD_FLASH)) for issue in listed)
    assert any(issue.excuses(_error(NEW_FLASH)) for issue in listed)
    assert not any(issue.excuses(_error("RuntimeError: other")) for issue in listed)


def test_an_entry_covers_the_compiled_twins_of_its_cases_unless_it_names_its_modes():
    """An issue of diffusers is the same compiled: the eager glob matches `.../train/compile`, and its evidence must
    still lie in the band; `modes` limits an entry to the modes it is about (an Inductor error)."""
    assert NORMS.applies("flux/tp2/native/fp32/train/compile") and NORMS.applies("flux/tp2/native/fp32/train")
    assert not NORMS.applies("flux/tp2/native/fp32/tensor/compile")
    inductor = KnownIssue("qwenimage@masked/ulysses2/*", "Inductor", error_contains="CppCSEVariable",
                          modes=("compile", "regional"), key="test #2")
    assert inductor.applies("qwenimage@masked/ulysses2/native/fp32/tensor/regional")
    assert not inductor.applies("qwenimage@masked/ulysses2/native/fp32/tensor")
    assert not inductor.applies("qwenimage@masked/ulysses2/native/fp32/tensor/aot_eager")


def test_an_unknown_mode_in_an_entry_names_the_file(tmp_path):
    path = tmp_path / "known_issues.toml"
    path.write_text('[[issue]]\nmatch = "*"\nreason = "r"\nerror_contains = "x"\nmodes = ["jit"]\n')
    with pytest.raises(HarnessError, match=r"known_issues.toml: \[\[issue\]\] #1.*unknown modes \['jit'\]"):
        load_known_issues(path)


def _missing(module, collective, got, predicted):
    return Evidence("proof.comms", f"{module}: {got} {collective}, expected >= {predicted}", f"{module}: {collective}",
                    got, predicted)


def test_a_failed_proof_is_excused_only_where_an_entry_names_it_exactly(tmp_path):
    """processor_after's finding: 0 all-to-alls at every attention module where one Ulysses call predicts 4. The entry
    naming that (subjects, counts seen, counts predicted) excuses it; every other shortfall (another module's, a
    count seen that is not 0, a count predicted outside its band) and any proof without counts stays FAIL, and the
    loader refuses a proof table that leaves the counts out."""
    path = tmp_path / "known.toml"
    path.write_text('[[issue]]\nmatch = "*"\nreason = "processor set after CP"\n[issue.evidence."proof.comms"]\n'
                    'subjects = ["*.attn: all_to_all"]\nband = [0, 0]\nlimit = [4, 4]\n')
    (entry,) = load_known_issues(path)
    named = [_missing("transformer_blocks.0.attn", "all_to_all", 0, 4),
             _missing("single_transformer_blocks.0.attn", "all_to_all", 0, 4)]
    excused = apply_known_issues(_result(named, "flux/ulysses2/native/fp32/tensor"), [entry])
    assert excused.status is Status.XFAIL and excused.severity == "silently wrong"
    for other in (_missing("proj_out", "all_gather", 0, 1), _missing("transformer_blocks.0.attn", "all_to_all", 2, 4),
                  _missing("transformer_blocks.0.attn", "all_to_all", 0, 8),
                  Evidence("proof.dispatch", "requested native, dispatched _native_math", "native")):
        result = apply_known_issues(_result([*named, other], "flux/ulysses2/native/fp32/tensor"), [entry])
        assert result.status is Status.FAIL and result.reason.startswith(other.text), other
    path.write_text('[[issue]]\nmatch = "*"\nreason = "r"\n[issue.evidence."proof.comms"]\nsubjects = ["*.attn: '
                    'all_to_all"]\nband = [0, 0]\n')
    with pytest.raises(HarnessError, match=r"needs 'limit': .* the counts predicted"):
        load_known_issues(path)
    path.write_text('[[issue]]\nmatch = "*"\nreason = "r"\n[issue.evidence."proof.dispatch"]\nband = [0, 0]\n')
    with pytest.raises(HarnessError, match="unknown check"):  # a proof without counts cannot be named
        load_known_issues(path)


def test_a_hang_is_excused_only_where_its_ranks_hung(tmp_path):
    """A TIMEOUT entry names the place the ranks hang (a text of their stacks): a TIMEOUT whose stacks hold it is
    XFAIL, a hang; one whose ranks hung anywhere else stays TIMEOUT (the control), and an entry without that text is
    refused."""
    path = tmp_path / "known.toml"
    path.write_text('[[issue]]\nmatch = "*"\nreason = "the ranks decide apart"\nstatus = "TIMEOUT"\n'
                    'error_contains = "first_block_cache.py"\n')
    (entry,) = load_known_issues(path)
    assert entry.finding == "hang"

    def hung(where):
        result = base_result(Case("flux", parse_layout("ulysses2"), "native", "fp32", flow="cache_fbc"))
        result.status, result.reason = Status.TIMEOUT, "case timeout after 120 s"
        result.extra["traceback"] = f'rank 1:\n  File "diffusers/hooks/{where}", line 168, in new_forward'
        return apply_known_issues(result, [entry])

    known = hung("first_block_cache.py")
    assert known.status is Status.XFAIL and known.severity == "hang" and known.reason.endswith("observed case "
                                                                                                "timeout after 120 s")
    assert hung("context_parallel.py").status is Status.TIMEOUT
    path.write_text('[[issue]]\nmatch = "*"\nreason = "r"\nstatus = "TIMEOUT"\n')
    with pytest.raises(HarnessError, match="needs 'error_contains': a text of the ranks' stacks"):
        load_known_issues(path)
