"""The decode profile's aggregation (per-step kernel time by name and family) and its report line."""
import pytest

from tilefly.bench.e2e import profile, report


def test_families_of_known_kernel_names():
    assert profile.family("mx_gemm_v2_kernel") == "tilefly GEMM"
    assert profile.family("gemm_splitk_kernel") == "tilefly GEMM"
    assert profile.family("rms_norm_rows_kernel") == "tilefly other"
    assert profile.family("mx_quantize_kernel") == "tilefly other"
    assert profile.family("add_rms_norm_mx_quantize_kernel") == "tilefly other"
    assert profile.family("silu_mul_mx_quantize_kernel") == "tilefly other"
    assert profile.family("decode_split_kernel") == "tilefly attention"
    assert profile.family("attention_fwd512_kernel") == "tilefly attention"
    assert profile.family("nvjet_sm90_tst_128x64_64x8_2x1_v_bz_TNT") == "cuBLAS / CUTLASS GEMM"
    assert profile.family("triton_tem_fused_mm_0") == "Triton template (Inductor)"
    assert profile.family("triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_3") == "Triton fused (Inductor)"
    assert profile.family("void flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits>") == "attention"
    assert profile.family("Memset (Device)") == "copy / fill"
    assert profile.family("some_unknown_thing") == "other"


def test_kernel_table_sums_per_name_and_divides_by_steps():
    records = [("mx_gemm_v2_kernel", 400.0, 8), ("mx_gemm_v2_kernel", 200.0, 8),
               ("triton_poi_fused_add_0", 100.0, 16), ("nvjet_x", 50.0, 4), ("odd", 10.0, 4)]
    table = profile.kernel_table(records, steps=4, top=2)
    assert table["steps"] == 4
    assert table["busy_us_per_step"] == pytest.approx(760.0 / 4)
    assert table["kernels_per_step"] == pytest.approx(40 / 4)
    assert [t["name"] for t in table["top"]] == ["mx_gemm_v2_kernel", "triton_poi_fused_add_0"]
    assert table["top"][0] == {"name": "mx_gemm_v2_kernel", "us_per_step": 150.0, "calls_per_step": 4.0}
    fams = {f["family"]: f for f in table["families"]}
    assert fams["tilefly GEMM"]["us_per_step"] == pytest.approx(150.0)
    assert fams["other"]["calls_per_step"] == pytest.approx(1.0)
    assert table["families"][0]["family"] == "tilefly GEMM"  # largest first
    assert sum(f["us_per_step"] for f in table["families"]) == pytest.approx(table["busy_us_per_step"])


def test_launch_table_splits_a_kernel_by_grid():
    events = [{"ph": "X", "cat": "kernel", "name": "mx_gemm_v2_kernel", "dur": 12.0, "args": {"grid": [64, 4, 1]}},
              {"ph": "X", "cat": "kernel", "name": "mx_gemm_v2_kernel", "dur": 14.0, "args": {"grid": [64, 4, 1]}},
              {"ph": "X", "cat": "kernel", "name": "mx_gemm_v2_kernel", "dur": 9.0, "args": {"grid": [16, 8, 1]}},
              {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "dur": 100.0},
              {"ph": "X", "cat": "kernel", "name": "decode_split_kernel", "dur": 3.0, "args": {"grid": [256, 3, 1]}}]
    rows = profile.launch_table(events, steps=2, top=2)
    assert rows == [
        {"name": "mx_gemm_v2_kernel", "grid": [64, 4, 1], "us_per_step": 13.0, "calls_per_step": 1.0,
         "us_per_call": 13.0},
        {"name": "mx_gemm_v2_kernel", "grid": [16, 8, 1], "us_per_step": 4.5, "calls_per_step": 0.5,
         "us_per_call": 9.0}]


def test_kernel_table_refuses_no_steps():
    with pytest.raises(ValueError, match="steps"):
        profile.kernel_table([], steps=0)


def test_markdown_shows_a_profiled_side():
    table = profile.kernel_table([("mx_gemm_v2_kernel", 3000.0, 10), ("triton_poi_fused_0", 1000.0, 30)], steps=1)
    table["wall_us_per_step"] = 4500.0
    side = {"tok_s": 1000.0, "tpot_ms": 4.5, "ttft_ms": 50.0, "compile_s": 30.0, "profile": table}
    run = {"kind": "tilefly-e2e", "schema": 1, "model": "llama-3.1-8b", "precision": "bf16", "input_len": 256,
           "output_len": 512, "compile_mode": "max-autotune", "runs": 1, "date": "2026-12-01T00:00:00+00:00",
           "rows": [{"concurrency": 8, "B": side}]}
    text = report.markdown(report.merge([run]))
    assert ("decode profile, 8 requests, side B: profiled step 4500 µs, GPU busy 4000 µs in 40 kernels: "
            "tilefly GEMM 3000, Triton fused (Inductor) 1000") in text
    assert "B's tilefly GEMM kernels a step (profile): mx_gemm_v2_kernel x10" in text
    assert profile.tilefly_gemms(profile.kernel_table([("triton_poi_fused_0", 1.0, 1)], steps=1)) == ""


def test_profile_decode_runs_on_a_cpu_model():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tilefly.bench.e2e import engine, models

    model = models.build_model("tiny", dtype=torch.float32, device="cpu", seed=0)
    cache = engine.new_cache(model, 2, 8 + 6)
    eng = engine.Engine(model, cache, 2, 8, 6)
    prompts = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(0))
    table = profile.profile_decode(eng, prompts, steps=20)
    assert table["steps"] == 5  # capped at the decode steps a generation has
    assert table["busy_us_per_step"] == 0 and table["top"] == [] and table["wall_us_per_step"] > 0
    # the profiled steps continued from the prefill: the cache holds prompt + 5 tokens
    assert int(cache.layers[0].cumulative_length) == 8 + 5


def test_a_slow_inductor_reduction_marks_the_step_suspect():
    """Sessions 35 and 37: compiles put a 32-row fused RMSNorm in one program (200 µs a call) and in 16
    programs (79 µs a call), against 2-4 µs in 32 programs."""
    table = profile.kernel_table([("triton_red_fused_add_mean_mul_pow_rsqrt_13", 3000.0, 15)], steps=1)
    table["wall_us_per_step"] = 3500.0
    lone = {"name": "triton_red_fused_add_mean_mul_pow_rsqrt_13", "grid": [1, 1, 1], "us_per_step": 3000.0,
            "calls_per_step": 15.0, "us_per_call": 200.0}
    few = {**lone, "name": "triton_red_fused_add_mean_mul_pow_rsqrt_12", "grid": [16, 1, 1], "us_per_call": 79.0}
    table["launches"] = [lone, few,
                         {**lone, "name": "triton_red_fused__unsafe_view_argmax_select_16", "us_per_call": 20.0},
                         {**lone, "name": "triton_tem_fused_mm_4", "us_per_call": 90.0},        # a GEMM template
                         {**lone, "name": "triton_poi_fused_lshift_mul_7", "us_per_call": 60.0},  # MX dequant
                         {**lone, "name": "mx_gemm_v2_kernel", "us_per_call": 90.0}]            # not Inductor's
    assert profile.slow_fused(table) == [lone, few]
    assert profile.describe(table).endswith(
        "; SUSPECT COMPILE, slow Inductor fused kernels (profile.slow_fused): "
        "triton_red_fused_add_mean_mul_pow_rsqrt_13 grid [1, 1, 1] 200 µs a call x15, "
        "triton_red_fused_add_mean_mul_pow_rsqrt_12 grid [16, 1, 1] 79 µs a call x15")
    table["busy_us_per_step"] = 200.0 / profile.SLOW_FUSED_SHARE + 1.0   # once a step, under 2% of it
    lone["us_per_step"] = few["us_per_step"] = 200.0
    assert profile.slow_fused(table) == []
    table["busy_us_per_step"] = 3000.0
    table["launches"] = table["launches"][2:]
    assert "SUSPECT" not in profile.describe(table)


def test_kernel_sources_finds_each_definition_of_a_cut_name_in_the_wrapper_code():
    def wrapper(name, body):
        return (f"{name} = async_compile.triton('{name}', '''\nimport triton\n@triton.jit\ndef {name}(x):\n"
                f"    {body}\n''', device_str='cuda')\n")

    long_name = "triton_red_fused__to_copy__unsafe_view_add_mean_mul_pow_rsqrt_" + "x" * 80 + "_13"
    graph_1 = wrapper(long_name, "pass  # graph 1") + wrapper("triton_poi_fused_silu_6", "pass")
    graph_2 = wrapper(long_name, "pass  # graph 2") + wrapper(long_name, "pass  # graph 2")
    found = profile.kernel_sources([graph_1, graph_2], [long_name[:120], "triton_red_fused_absent_1"])
    assert list(found) == [long_name[:120]]
    assert [src.splitlines()[-1] for src in found[long_name[:120]]] == ["    pass  # graph 1", "    pass  # graph 2"]
    assert all(f"def {long_name}(x):" in src for src in found[long_name[:120]])
    assert profile.kernel_sources([], ["triton_red_fused_1"]) == {}
