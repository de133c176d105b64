"""The kernel-table filter on a profiler table with duplicated aten/kernel rows (fixtures/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from align.probes.kernels import (
    ProfRow,
    is_device_kernel,
    is_fallback,
    kernel_arch,
    kernel_group,
    kernel_table,
    parse_table,
    rows_from_events,
)

FIXTURE = Path(__file__).parent / "fixtures" / "profile_table_sm90.txt"
STEPS = 3
# Designed totals of the fixture, in ms (fixtures/README.md); the printed table rounds each row to 1 us.
GROUPS_MS = {"attention": 22.8358, "gemm": 5.0840, "elementwise": 2.8456, "memcpy": 0.3071, "comm": 0.0,
             "other": 0.5204}
TOTAL_MS = 31.5929
KERNELS = {
    "fmha_cutlassB_bf16_aligned_128x64_k65536_sm80", "fmha_cutlassF_bf16_aligned_64x128_gmem_sm80",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
    "nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNT", "ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x4_tn",
    "Memcpy HtoD (Pageable -> Device)", "Memset (Device)", "Memcpy DtoD (Device -> Device)",
}


@pytest.fixture(scope="module")
def rows():
    return parse_table(FIXTURE.read_text())


def test_parse_reads_every_row_with_its_device_time(rows):
    assert len(rows) == 34
    by = {r.name: r for r in rows}
    assert by["aten::_efficient_attention_backward"].self_device_us == pytest.approx(16145.0)
    assert by["fmha_cutlassB_bf16_aligned_128x64_k65536_sm80"].calls == 48
    assert by["cudaLaunchKernel"].self_device_us == 0.0


def test_only_device_kernel_rows_are_kept(rows):
    t = kernel_table(rows, STEPS)
    names = {k["name"] for k in t.kernels}
    assert len(t.kernels) == 15
    assert KERNELS <= names
    assert not any(n.startswith(("aten::", "autograd::", "cuda", "Optimizer.")) or n.endswith("Backward0")
                   for n in names)
    assert sum(n.startswith("void ") for n in names) == 7


def test_total_is_the_kernel_sum_not_the_double_counted_table(rows):
    t = kernel_table(rows, STEPS)
    assert t.total_ms == pytest.approx(TOTAL_MS, abs=0.005)
    # summing every row (what key_averages() invites) gives twice the step
    assert t.unfiltered_ms / t.total_ms == pytest.approx(2.0, abs=0.01)
    # the tell: host rows whose device time equals a kernel row's exactly
    pairs = {(h, k) for h, k, _ in t.duplicates}
    assert ("aten::_efficient_attention_backward", "fmha_cutlassB_bf16_aligned_128x64_k65536_sm80") in pairs
    assert ("aten::_efficient_attention_forward", "fmha_cutlassF_bf16_aligned_64x128_gmem_sm80") in pairs
    assert len(t.duplicates) == 9


def test_groups_split_the_kernel_time(rows):
    t = kernel_table(rows, STEPS)
    assert list(t.groups) == ["attention", "gemm", "elementwise", "memcpy", "comm", "other"]
    for g, ms in GROUPS_MS.items():
        assert t.groups[g]["ms"] == pytest.approx(ms, abs=0.005), g
    assert sum(v["pct"] for v in t.groups.values()) == pytest.approx(1.0)
    assert t.groups["attention"]["pct"] == pytest.approx(0.723, abs=0.001)


def test_total_is_checked_against_measured_wall(rows):
    ok = kernel_table(rows, STEPS, wall_s=TOTAL_MS / 1e3 / 0.895)
    assert ok.wall_ratio == pytest.approx(0.895, abs=0.001) and ok.wall_ok
    assert kernel_table(rows, STEPS, wall_s=0.025).wall_ok is False  # 126%: double counting / overlap
    assert kernel_table(rows, STEPS, wall_s=0.050).wall_ok is False  # 63%: idle gaps
    # had the aten rows been kept, the same wall would flag it
    unfiltered_ratio = ok.unfiltered_ms / 1e3 / ok.wall_s
    assert unfiltered_ratio > 1.05


def test_old_arch_and_fallback_kernels_are_flagged_on_sm90(rows):
    t = kernel_table(rows, STEPS, device_arch=90)
    old = {k["name"] for k in t.old_arch}
    assert old == {
        "fmha_cutlassB_bf16_aligned_128x64_k65536_sm80", "fmha_cutlassF_bf16_aligned_64x128_gmem_sm80",
        "ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x4_tn",
        "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x1_tn_align8>"
        "(cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x1_tn_align8::Params)",
    }
    assert [k["name"] for k in t.fallback] == ["fmha_cutlassF_bf16_aligned_64x128_gmem_sm80"]
    # on an sm_80 device the same kernels are current
    assert kernel_table(rows, STEPS, device_arch=80).old_arch == []


def test_launches_per_step(rows):
    t = kernel_table(rows, STEPS)
    assert t.launches_per_step == pytest.approx(3072 / 3)
    assert t.copies_per_step == pytest.approx(255 / 3)


@pytest.mark.parametrize("name,arch", [
    ("fmha_cutlassF_bf16_aligned_64x128_gmem_sm80", 80), ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 90),
    ("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x4_tn", 80),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop", 90),
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x3_tn_align8>", 80),
    ("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNT", None), ("void at::native::vectorized_elementwise_kernel<4>", None),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, "
     "cutlass::bfloat16_t>>", None),
])
def test_kernel_arch_from_symbol(name, arch):
    assert kernel_arch(name) == arch


@pytest.mark.parametrize("name,group", [
    ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits>", "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1", "attention"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x3_tn_align8>", "gemm"),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "comm"),
    ("Memset (Device)", "memcpy"),
    ("triton_poi_fused_add_mul_0", "elementwise"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float>", "other"),
])
def test_kernel_groups(name, group):
    assert kernel_group(name) == group


def test_fallback_names():
    assert is_fallback("fmha_cutlassF_bf16_aligned_32x128_gmem_sm80")
    assert not is_fallback("fmha_cutlassB_bf16_aligned_128x64_k65536_sm80")


def test_live_rows_trust_the_profilers_device_flag():
    # A name that looks like a kernel but the profiler says is host-side (a user annotation) is dropped,
    # and a device row is kept whatever its name.
    assert not is_device_kernel(ProfRow("void looks_like_a_kernel", 1, 10.0, is_device=False))
    assert is_device_kernel(ProfRow("some_new_kernel_name", 1, 10.0, is_device=True))


def test_a_cpu_profile_has_no_device_kernels():
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(64, 64, requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        (x @ x).sum().backward()
    rows = rows_from_events(prof.key_averages())
    assert any(r.name == "aten::mm" for r in rows)
    assert all(r.is_device is False for r in rows)
    t = kernel_table(rows, steps=1, wall_s=0.01)
    assert t.kernels == [] and t.total_ms == 0.0
    assert t.profiler_flops >= 2 * 64**3  # the profiler counts the forward matmul's FLOPs on host rows


def test_user_annotations_on_the_device_timeline_are_not_kernels():
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEventAvg

    def ev(name, device, annotation):
        e = FunctionEventAvg()
        e.key, e.count, e.self_device_time_total = name, 1, 100.0
        e.device_type, e.is_user_annotation = device, annotation
        return e

    rows = rows_from_events([ev("ProfilerStep#3", DeviceType.CUDA, True), ev("fmha_x_sm80", DeviceType.CUDA, False),
                             ev("aten::mm", DeviceType.CPU, False)])
    assert [r.is_device for r in rows] == [False, True, False]
