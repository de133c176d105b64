"""The serving path preflight states (align/run/serving.py): each verdict by table, vLLM's class read
through its MRO (a fake `vllm` module stands in: vLLM is not installed here), the manifest entry and
the preflight command's lines."""

from __future__ import annotations

import dataclasses
import sys
import types
from dataclasses import dataclass

import pytest
import torch

from align.config import to_typed
from align.run.cli import compose
from align.run.manifest import load
from align.run.record import RunRecord
from align.run.serving import VLLM_NOT_INSTALLED, Verdict, serving_path
from tests.conftest import run_cli
from tests.integration.test_truthful_run import assert_present_and_null

MOE_LORA = ("model=gemma4_moe", "model.lora.enabled=true")


def typed(*overrides: str):
    return to_typed(compose(["logger=none", *overrides]))


@pytest.fixture
def no_vllm(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError, installed or not


# A vLLM-like class hierarchy: the flag and the method live on bases, as in vLLM's interfaces.
class SupportsLoRA:
    supports_lora = True


class MoEBase(SupportsLoRA):
    def get_expert_mapping(self):
        return []


class DenseLoRA(SupportsLoRA):
    pass


class DenseNoLoRA:
    pass


class MoELoRAMapped(MoEBase):
    pass


class MoELoRAUnmapped(SupportsLoRA):
    pass


class LoRAOptedOut(SupportsLoRA):
    supports_lora = False


@pytest.fixture
def fake_vllm(monkeypatch):
    """Install a fake `vllm` whose registry maps the architectures it is given to classes."""

    def install(classes: dict[str, type], loader: bool = True):
        class Registry:
            def get_supported_archs(self):
                return classes.keys()

        if loader:
            Registry._try_load_model_cls = lambda self, arch: classes.get(arch)
        module = types.ModuleType("vllm")
        module.ModelRegistry = Registry()
        monkeypatch.setitem(sys.modules, "vllm", module)

    return install


@pytest.mark.parametrize("overrides,verdict", [
    (("model=mistral",), Verdict.as_is),
    (("model=mistral", "model.lora.enabled=true"), Verdict.hot_swap),
    (MOE_LORA, Verdict.merged),
    (("model=olmoe", "model.lora.enabled=true"), Verdict.merged),
    (("model=gemma4_moe",), Verdict.as_is),
])
def test_without_vllm_the_structural_verdict_is_stated_as_unchecked(no_vllm, overrides, verdict):
    e = serving_path(typed(*overrides))
    assert e["verdict"] == verdict.value
    assert e["checked"] is False and e["why"] == VLLM_NOT_INSTALLED and e["basis"].startswith("structural")
    assert e["vllm"] is None


def test_the_entry_says_what_the_export_holds_per_lora_export_choice(no_vllm):
    assert serving_path(typed("model=mistral"))["export"] == "full weights"
    says = {c: serving_path(typed("model=mistral", "model.lora.enabled=true", f"model.lora.export={c}"))["export"]
            for c in ("merged", "adapter", "both")}
    assert says["merged"].startswith("merged weights") and "no separate adapter" in says["merged"]
    assert says["adapter"].startswith("the PEFT adapter alone, in export/adapter/")
    assert says["both"].startswith("merged weights") and says["both"].endswith("the PEFT adapter in export/adapter/")


@pytest.mark.parametrize("overrides,cls,verdict,says", [
    (("model=mistral", "model.lora.enabled=true"), DenseLoRA, Verdict.hot_swap, "supports_lora from SupportsLoRA"),
    (("model=mistral", "model.lora.enabled=true"), DenseNoLoRA, Verdict.merged, "does not set supports_lora"),
    (("model=mistral", "model.lora.enabled=true"), LoRAOptedOut, Verdict.merged, "does not set supports_lora"),
    (MOE_LORA, MoELoRAMapped, Verdict.hot_swap, "get_expert_mapping from MoEBase"),
    (MOE_LORA, MoELoRAUnmapped, Verdict.merged, "defines no get_expert_mapping"),
    (("model=gemma4_moe",), MoELoRAUnmapped, Verdict.as_is, "full fine-tune"),
    (("model=mistral",), DenseNoLoRA, Verdict.as_is, "full fine-tune"),
])
def test_with_vllm_the_class_mro_decides(fake_vllm, overrides, cls, verdict, says):
    cfg = typed(*overrides)
    fake_vllm({"MistralForCausalLM": cls, "Gemma4ForCausalLM": cls})
    e = serving_path(cfg)
    assert (e["verdict"], e["checked"], e["why"]) == (verdict.value, True, None)
    assert says in e["reason"] and e["vllm"]["class"].endswith(cls.__qualname__)


def test_an_architecture_vllm_does_not_register_is_unknown_for_lora(fake_vllm):
    fake_vllm({"SomethingElseForCausalLM": DenseLoRA})
    e = serving_path(typed(*MOE_LORA))
    assert e["verdict"] == Verdict.unknown.value and e["checked"] is True
    assert e["vllm"] is None and e["why"] == "vLLM registers no class for Gemma4ForCausalLM"


def test_a_registry_that_cannot_load_falls_back_to_the_structural_verdict(fake_vllm):
    fake_vllm({"Gemma4ForCausalLM": MoELoRAMapped}, loader=False)  # the private loader renamed away
    e = serving_path(typed(*MOE_LORA))
    assert e["checked"] is False and e["verdict"] == Verdict.merged.value
    assert e["why"].startswith("not checked: vLLM's registry could not load Gemma4ForCausalLM: AttributeError")


# --------------------------------------------------------------------------------- base viability


@dataclass
class Estimate:
    total: int
    device_bytes: int | None

    @property
    def fits(self):
        return None if self.device_bytes is None else self.total <= self.device_bytes


def test_on_cpu_viability_gives_the_estimate_and_a_null_fit_with_why(no_vllm):
    from align.plan.budget_auto import plan_sizes
    from align.plan.memory import estimate_memory
    from align.plan.planner import plan

    cfg = typed("model=mistral")
    job = plan(cfg, torch.device("cpu"))
    v = serving_path(cfg, job)["viability"]
    resolved, _ = plan_sizes(cfg, torch.device("cpu"))  # the auto sizes, as the trainer resolves them
    assert v["estimate_bytes"] == estimate_memory(resolved, torch.device("cpu")).total > 0  # the one estimate
    assert v["estimate_bytes"] == job.estimate.total  # the job's plan's, not one of its own
    assert v["fits"] is None and v["device_bytes"] is None and v["why"].startswith("trainer device is cpu")
    unplanned = serving_path(cfg)["viability"]  # a record started without the job's preflight report
    assert unplanned["estimate_bytes"] is None and unplanned["fits"] is None and unplanned["why"].startswith("no plan")


@pytest.mark.parametrize("device_bytes,fits,line", [(8 << 30, True, "fits: estimate 2.0 GiB of 8.0 GiB (cuda)"),
                                                    (1 << 30, False, "does not fit: estimate 2.0 GiB of 1.0 GiB"),
                                                    (None, None, "cannot be read")])
def test_on_an_accelerator_viability_compares_the_estimate_with_its_memory(no_vllm, device_bytes, fits, line):
    from align.plan.planner import plan
    from align.run.serving import lines

    cfg = typed("model=mistral")  # the plan of a job on a CUDA device, with an estimate of 2 GiB
    job = dataclasses.replace(plan(cfg, torch.device("cpu")), device=torch.device("cuda"),
                              estimate=Estimate(2 << 30, device_bytes))
    e = serving_path(cfg, job)
    assert e["viability"]["fits"] is fits and e["viability"]["device_bytes"] == device_bytes
    assert line in lines(e)[1]


# ------------------------------------------------------------------------------ manifest and CLI


def test_the_manifest_has_a_serving_entry_present_and_null(no_vllm, tmp_path):
    from align.plan.planner import plan
    from align.run.checklist import Report

    cfg = compose(["logger=none", "allow_dirty=true", *MOE_LORA])
    job = plan(to_typed(cfg), torch.device("cpu"))
    record = RunRecord(to_typed(cfg), {}, tmp_path / "run", [], [])
    with record:
        record.start(Report(plan=job))  # the job's preflight report carries its plan
        record.finished(None, 0)
    m = load(tmp_path / "run")
    assert_present_and_null(m)
    s = m["serving"]
    assert s["verdict"] == "merged weights required" and s["checked"] is False and s["why"] == VLLM_NOT_INSTALLED
    assert set(s) == {"architecture", "lora", "moe", "export", "checked", "why", "basis", "vllm", "verdict",
                      "reason", "viability"}
    assert s["vllm"] is None and s["viability"]["fits"] is None and s["viability"]["why"]
    assert s["viability"]["estimate_bytes"] == job.estimate.total


def test_the_preflight_command_prints_the_serving_and_viability_lines(no_vllm, capsys):
    from align.tools.preflight import main

    assert main(["allow_dirty=true", "logger=none", *MOE_LORA]) == 0
    out = capsys.readouterr().out.splitlines()
    serving = [x for x in out if x.startswith("serving: ")]
    assert len(serving) == 1 and serving[0].startswith("serving: merged weights required: LoRA on an MoE family")
    assert f"[{VLLM_NOT_INSTALLED}; structural" in serving[0] and "merged weights (align.models.export" in serving[0]
    assert [x for x in out if x.startswith("base viability: unknown: estimate ")]


def test_a_failed_preflight_states_no_serving_path(no_vllm, capsys, tmp_path):
    from align.tools.preflight import main

    assert main(["allow_dirty=true", "logger=none", "data.source=jsonl", f"data.path={tmp_path}/missing.jsonl"]) == 2
    out = capsys.readouterr().out
    assert "serving: not stated: the config failed preflight" in out and "base viability" not in out


def test_the_issue_spelling_python_m_align_preflight_runs_the_same_command():
    p = run_cli("align.preflight", "allow_dirty=true", "logger=none", *MOE_LORA, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "preflight PASS" in p.stdout and "\nserving: " in p.stdout and "\nbase viability: " in p.stdout
