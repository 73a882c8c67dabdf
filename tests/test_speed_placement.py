"""#49 item 6: with weights kept in host memory (``--n-cpu-moe``, ``--cpu-moe``, ``-ot ...=CPU``) the
expert matmuls run on the CPU, where a verification batch of k+1 tokens reads up to k+1 times the
experts one token reads: a GPU recipe's speedup minimum is not a claim about that placement. The
speed is reported and the verdict says why it is not judged, as on a CPU run; ``--enforce-speedup``
judges it. An -ot that moves tensors between GPUs keeps them GPU-resident (judged), and an offload
record that does not parse is read as GPU-resident (the stricter reading)."""

from __future__ import annotations

import copy

from ggufmtp.provenance.card_page import FileRow
from ggufmtp.provenance.page_tables import speed_cell
from ggufmtp.provenance.placement import Placement
from ggufmtp.provenance.vacuous import vacuous_thresholds
from ggufmtp.provenance.verdict import Thresholds, Verdict, judge_recorded
from ggufmtp.runtime.offload import Offload

TH = Thresholds(min_acceptance=0.6, min_speedup=1.2)


def _recorded(offload: object, offloaded: bool = True, speedup: float = 1.05, th: Thresholds = TH) -> dict:
    """A recorded verification of 4 identical pairs at 80 % acceptance and ``speedup``."""
    mode = {"mtp": {"acceptance": 0.8}, "speedup": speedup, "identical_output_fraction": 1.0}
    return {"verdict": "pass", **copy.deepcopy(mode), "identical_outputs": {"identical": 4, "pairs": 4},
            "mismatch_count": 0, "mismatches": [], "modes": {"default": mode},
            "settings": {"n_prompts": 4, "seeds": [42], "draft_n_max": 3, "max_tokens": 64, "offload": offload,
                         "prompt_ids": ["p0", "p1", "p2", "p3"], "modes": ["default"], "endpoints": ["chat"]},
            "thresholds": th.to_dict(), "hardware": {"offloaded": offloaded, "gpu": "NVIDIA H200"}}


N_CPU_MOE = Offload(n_cpu_moe=30).to_dict()


def test_host_weights_report_the_speed_and_do_not_judge_it():
    verdict, reasons = judge_recorded(_recorded(N_CPU_MOE))
    assert (verdict, reasons) == (Verdict.PASS, [])
    assert Placement.of_record(_recorded(N_CPU_MOE)).why_unjudged().startswith("weights were kept in host memory (--n-cpu-moe 30)")
    for o in (Offload(cpu_moe=True), Offload(override_tensor=("exps=CPU",))):
        assert judge_recorded(_recorded(o.to_dict()))[0] == Verdict.PASS, o


def test_a_gpu_resident_run_is_judged_against_the_minimum():
    for offload in (None, Offload().to_dict(), Offload(override_tensor=("blk\\.1[0-9]\\.=CUDA1",)).to_dict()):
        verdict, reasons = judge_recorded(_recorded(offload))
        assert verdict == Verdict.FAIL and reasons == ["speedup 1.050× is below the minimum 1.200×"], offload


def test_enforce_speedup_judges_host_weights_too():
    verdict, reasons = judge_recorded(_recorded(N_CPU_MOE, th=Thresholds(0.6, 1.2, enforce_speedup=True)))
    assert verdict == Verdict.FAIL and "speedup" in reasons[0]


def test_an_offload_record_that_does_not_parse_is_judged():
    for bad in ("--n-cpu-moe 30", {"n_cpu_moe": -1}, {"override_tensor": ["no-equals-sign"]}, {"n_cpu_moe": True}):
        assert judge_recorded(_recorded(bad))[0] == Verdict.FAIL, bad


def test_zero_speed_minimum_is_vacuous_only_where_speed_is_judged():
    zero = Thresholds(0.6, 0.0)
    assert "min_speedup" in vacuous_thresholds(_recorded(None, th=zero))
    assert "min_speedup" not in vacuous_thresholds(_recorded(N_CPU_MOE, th=zero))


def _row(verification: dict) -> FileRow:
    return FileRow(artifact="m-Q4_K_M.gguf", receipt="m-Q4_K_M.receipt.json", recipe="hifi-q4_k_m-mtp", size_bytes=1,
                   bpw=None, quality={}, verification=verification, unverified=None, source={})


def test_the_page_says_why_the_speed_is_not_verified():
    assert speed_cell(_row(_recorded(N_CPU_MOE))) == "not verified (weights in host memory)"
    assert speed_cell(_row(_recorded(None, offloaded=False))) == "not verified (no GPU offload)"
    assert speed_cell(_row(_recorded(None))).startswith("1.05")
