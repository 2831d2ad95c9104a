"""The cost models, quantization, speculative decoding, and compare against published vLLM runs.
Arithmetic is checked on cases worked out by hand; accuracy on the measured runs in
code/fixtures/published-runs/llmservingsim (published by casys-kaist/LLMServingSim, MIT; see SOURCE.md there)."""
import csv
import json
import math
import os
import tempfile
import unittest

from helpers import FIXTURES, call_cli, main

RUNS = os.path.join(FIXTURES, "published-runs", "llmservingsim")
TOY_GPU = main.Hardware("toy", 80, 1000, 100, step_overhead_ms=0.0, gemm_efficiency=0.5, attention_efficiency=0.25,
                        bandwidth_efficiency=0.5)
TOY_MODEL = main.ModelSpec("toy", 1e9, 2, 1, 64, hidden_size=128, heads=2, vocab_size=1000)


class KernelCost(unittest.TestCase):
    def test_a_step_costs_gemms_and_attention_each_at_its_slower_side(self):
        cost = main.KernelCost(TOY_GPU, TOY_MODEL)
        embedding = 1000 * 128
        linear = 2 * (1e9 - 2 * embedding)            # input embedding gathered, output projection per sequence
        gemm_compute = (linear * 256 + 2 * embedding * 128) / (100e12 * 0.5)   # 200 tokens: two 128-row tiles
        gemm_memory = (1e9 - embedding) * 2 / (1000e9 * 0.5)                 # the embedding table is not streamed
        attention_compute = 4 * 2 * 2 * 64 * 5000 / (100e12 * 0.25)
        attention_memory = 300 * TOY_MODEL.kv_bytes_per_token / (1000e9 * 0.5)
        seqs = 2
        kernels = 9 * 2 * (1.3 + 1.2) / 1e6                  # 9 kernels a layer, launched outside a CUDA graph
        gpu = (kernels + max(gemm_compute, gemm_memory) + max(attention_compute, attention_memory)) * main.KERNEL_SCALE
        cpu = (0.4 + seqs * 0.0011) / 1000                    # vLLM's scheduler, overlapped with the GPU
        expected = max(gpu, cpu)
        self.assertAlmostEqual(cost.step_seconds(200, 300, seqs, 5000), expected, places=12)

    def test_gemm_tiles_of_128_rows_make_129_tokens_cost_as_much_as_256(self):
        cost = main.KernelCost(TOY_GPU, TOY_MODEL)
        self.assertEqual(cost.step_seconds(129, 0, 1, 0), cost.step_seconds(256, 0, 1, 0))
        self.assertLess(cost.step_seconds(128, 0, 1, 0), cost.step_seconds(129, 0, 1, 0))

    def test_a_device_with_no_kernel_floor_is_a_cpu_in_every_step(self):
        # A hand-written device with launch costs but no floor: a CPU by the one rule, so its GEMMs
        # go by the row and every step, eager or graphed, pays its calibrated overheads.
        cpu = main.replace(TOY_GPU, kernel_floor_us=0.0, kernel_launch_us=5.0, step_overhead_ms=2.0,
                           seq_overhead_ms=1.0)
        cost = main.KernelCost(cpu, TOY_MODEL, engine=main.replace(main.ENGINES["vllm"], step_cpu_ms=0.0,
                                                                     seq_cpu_ms=0.0))
        self.assertLess(cost.step_seconds(128, 0, 1, 0), cost.step_seconds(129, 0, 1, 0))
        self.assertLess(cost.step_seconds(129, 0, 1, 0), cost.step_seconds(256, 0, 1, 0))
        bare = main.KernelCost(main.replace(cpu, step_overhead_ms=0.0, seq_overhead_ms=0.0), TOY_MODEL,
                               engine=cost.engine)
        for tokens, seqs in ((4, 4), (300, 1)):       # a graphed decode, an eager prefill
            extra = cost.step_seconds(tokens, 0, seqs, 0) - bare.step_seconds(tokens, 0, seqs, 0)
            self.assertAlmostEqual(extra, (2.0 + seqs * 1.0) / 1000, places=12)

    def test_tied_embeddings_are_streamed_once_as_the_output_projection(self):
        tied = main.KernelCost(TOY_GPU, main.replace(TOY_MODEL, tie_word_embeddings=True))
        untied = main.KernelCost(TOY_GPU, TOY_MODEL)
        self.assertEqual(tied.streamed_bytes, 1e9 * 2)
        self.assertEqual(untied.streamed_bytes, (1e9 - 128000) * 2)

    def test_a_model_without_the_new_fields_is_priced_as_a_plain_stack_of_weights(self):
        old = main.ModelSpec("old", 1e9, 2, 1, 64)           # a JSON preset written before these fields
        cost = main.KernelCost(TOY_GPU, old)
        self.assertEqual(cost.streamed_bytes, old.weight_bytes)
        self.assertEqual(cost.linear_flops_per_token, 2e9)

    def test_a_prefill_costs_quadratic_attention_a_decode_linear(self):
        requests = [main.Request(0, 1000, 5)]
        batch = main.Batch()
        batch.add(requests[0], 1000)
        self.assertEqual(batch.pairs, 1000 * 1001 // 2)       # each token attends to itself and all before it
        requests[0].computed = 1000
        decode = main.Batch()
        decode.add(requests[0], 1)
        self.assertEqual(decode.pairs, 1001)

    def test_the_roofline_is_the_lessons_formula_unchanged(self):
        h, m = main.HARDWARE["h100-sxm-80gb"], main.MODELS["llama-3.1-8b"]
        compute = 2 * m.params * 64 / (h.tflops * 1e12 * h.mfu)
        memory = (m.weight_bytes + 5000 * m.kv_bytes_per_token) / (h.bandwidth_gbs * 1e9 * h.mbu)
        self.assertAlmostEqual(main.step_seconds(h, m, 64, 5000, 64), h.step_overhead_ms / 1000 + max(compute, memory))


class MixtureOfExpertsLayer(unittest.TestCase):
    """The kernel model's price of one MoE layer's experts against vLLM's own measurement of its
    fused experts (benchmark_moe.py on an H100, vllm-project/vllm#24700: Qwen3-30B-A3B, FP8, TP 1)."""
    MEASURED_US = {1: 40.44, 2: 56.15, 4: 78.10, 8: 118.64, 16: 164.64, 32: 210.07, 64: 237.26, 128: 247.67}

    def priced_us(self, cost, model, tokens):
        shared = cost.weight_bytes - model.expert_bytes
        experts = (cost.weights_read(tokens) - shared) / model.layers
        return main.MOE_LAYER_US + experts / cost.stream_bytes_per_second * 1e6

    def test_the_fixed_part_and_the_bytes_price_every_measured_batch_within_10_percent(self):
        model = main.quantized(main.MODELS["qwen3-30b-a3b"], "fp8")
        cost = main.cost_model("kernels", main.HARDWARE["h100-sxm-80gb"], model, main.gemm_tflops(main.HARDWARE["h100-sxm-80gb"], "fp8"))
        self.assertAlmostEqual(cost.experts_fixed, 48 * 27e-6)
        for tokens, measured in self.MEASURED_US.items():
            self.assertAlmostEqual(self.priced_us(cost, model, tokens) / measured, 1, delta=0.10, msg=tokens)
        # Without the fixed part a lone token's experts would be priced at a third of their time.
        self.assertLess(self.priced_us(cost, model, 1) - main.MOE_LAYER_US, 0.35 * self.MEASURED_US[1])

    def test_dense_models_and_cpus_pay_no_experts_fixed_time(self):
        self.assertEqual(main.KernelCost(main.HARDWARE["h100-sxm-80gb"], main.MODELS["llama-3.1-8b"]).experts_fixed, 0)
        self.assertEqual(main.KernelCost(main.HARDWARE["cpu-4vcpu"], main.MODELS["qwen3-30b-a3b"]).experts_fixed, 0)


class Quantization(unittest.TestCase):
    def plan(self, *flags):
        code, out, err = call_cli("capacity", "--json", *flags)
        self.assertEqual(code, 0, err)
        return json.loads(out)

    def test_fp8_weights_take_one_byte_and_run_at_the_fp8_peak(self):
        bf16, fp8 = self.plan(), self.plan("--quantization", "fp8")
        self.assertAlmostEqual(fp8["weight_bytes"], bf16["weight_bytes"] / 2)
        h, m = main.HARDWARE["h100-sxm-80gb"], main.MODELS["llama-3.1-8b"]
        self.assertEqual(main.gemm_tflops(h, "fp8"), 1979)
        self.assertEqual(main.gemm_tflops(main.HARDWARE["a100-sxm-80gb"], "fp8"), 312)   # no FP8 tensor cores
        fast = main.Roofline(h, main.quantized(m, "fp8"), main.gemm_tflops(h, "fp8"))
        self.assertEqual(fast.flops_per_second, 1979e12 * h.mfu)
        # Half the weight bytes: the knee (compute meets the weight read) moves to half the tokens, then
        # twice that for twice the FLOPS: the same place.
        self.assertAlmostEqual(fp8["critical_batch_tokens"], bf16["critical_batch_tokens"], delta=0.5)

    def test_int4_weights_with_their_scales_take_17_thirty_seconds_of_a_byte(self):
        self.assertAlmostEqual(self.plan("--quantization", "int4")["model"]["weight_dtype_bytes"], 17 / 32)

    def test_fp8_kv_holds_twice_the_tokens_in_the_same_memory(self):
        bf16, fp8 = self.plan(), self.plan("--kv-cache-dtype", "fp8")
        self.assertEqual(fp8["kv_bytes_per_token"], bf16["kv_bytes_per_token"] // 2)
        self.assertAlmostEqual(fp8["num_blocks"], 2 * bf16["num_blocks"], delta=1)

    def test_on_an_l4_fp8_weights_and_kv_turn_two_thousand_blocks_into_eleven_thousand(self):
        bf16 = self.plan("--hardware", "l4-24gb")
        both = self.plan("--hardware", "l4-24gb", "--quantization", "fp8", "--kv-cache-dtype", "fp8")
        self.assertEqual((bf16["num_blocks"], both["num_blocks"]), (1941, 11541))


class SpeculativeDecoding(unittest.TestCase):
    def test_the_expected_accepted_length(self):
        self.assertAlmostEqual(main.expected_accepted_length(4, 0.7), (1 - 0.7 ** 5) / 0.3)
        self.assertEqual(main.expected_accepted_length(4, 1.0), 5)
        self.assertEqual(main.expected_accepted_length(4, 0.0), 1)

    def run_spec(self, **spec):
        return main.run(main.RunSpec(concurrency=8, requests=64, output_tokens=main.TokenRange(200, 200), **spec))

    def test_a_run_yields_the_expected_tokens_per_verify_step_and_exactly_each_requests_output(self):
        result = self.run_spec(speculative_tokens=4, acceptance_rate=0.7)
        spec = result["speculative"]
        self.assertAlmostEqual(spec["mean_accepted_length"], spec["expected_accepted_length"], delta=0.05)
        self.assertEqual(result["total_output_tokens"], 64 * 200)       # no request overshoots its output

    def test_it_cuts_tpot_when_decode_is_memory_bound_and_repeats_with_the_seed(self):
        plain = self.run_spec()
        fast = self.run_spec(speculative_tokens=4, acceptance_rate=0.7)
        self.assertLess(fast["mean_tpot_ms"], plain["mean_tpot_ms"] / 2)
        self.assertEqual(fast, self.run_spec(speculative_tokens=4, acceptance_rate=0.7))

    def test_each_verify_step_is_priced_as_k_plus_one_tokens(self):
        h, m = main.HARDWARE["h100-sxm-80gb"], main.MODELS["llama-3.1-8b"]
        engine = main.build_engines(main.RunSpec(speculative_tokens=3, acceptance_rate=0.0, simulator="step"))[0][0]
        request = main.Request(0, 100, 10)
        engine.scheduler.add(request)
        engine.step()                                       # the prefill and the first token
        start = engine.clock
        batch = engine.step()                               # one verify step: 1 + 3 positions
        self.assertEqual([(r.id, n) for r, n in batch], [(0, 4)])
        self.assertAlmostEqual(engine.clock - start, main.step_seconds(h, m, 4, 100 + 4, 1))
        self.assertEqual(request.generated, 2)              # nothing accepted: one token of its own

    def test_a_draft_of_another_tokenizer_is_refused(self):
        # helper-61: qwen2.5-7b or smollm2 drafting for llama-3.1-8b ran without a word
        with self.assertRaises(main.UserError) as e:
            main.run(main.RunSpec(requests=3, speculative_tokens=3, draft_model=main.MODELS["qwen2.5-7b"]))
        self.assertIn("has a vocabulary of 152,064 tokens and llama-3.1-8b 128,256", str(e.exception))

    def test_a_draft_no_smaller_than_the_model_is_refused(self):
        # --model and --draft-model swapped: a 70 B draft ran K times a step for an 8 B model.
        for draft in ("llama-3.1-70b", "llama-3.1-8b"):
            with self.assertRaisesRegex(main.UserError, f"--draft-model {draft} computes .* not fewer than llama-3.1-8b"):
                main.run(main.RunSpec(requests=3, speculative_tokens=3, draft_model=main.MODELS[draft]))
        # a smaller one of the family runs
        self.assertEqual(main.run(main.RunSpec(requests=3, speculative_tokens=3, model=main.MODELS["llama-3.1-70b"],
                                               tensor_parallel_size=4,
                                               draft_model=main.MODELS["llama-3.1-8b"]))["completed"], 3)

    def test_a_draft_model_costs_k_passes_and_its_weights(self):
        free = self.run_spec(speculative_tokens=4, acceptance_rate=0.7)
        small = main.replace(main.MODELS["smollm2-135m-q8_0"], vocab_size=main.MODELS["llama-3.1-8b"].vocab_size)
        drafted = self.run_spec(speculative_tokens=4, acceptance_rate=0.7, draft_model=small)
        self.assertGreater(drafted["mean_tpot_ms"], free["mean_tpot_ms"])
        self.assertLess(drafted["config"]["kv_tokens"], free["config"]["kv_tokens"])

    def test_a_draft_model_keeps_its_own_kv_in_every_block_and_shards_as_the_target(self):
        """The blocks are what the memory left after both models' weights holds at both models'
        KV bytes per token (helper-34: the draft's KV was not counted), and under tensor
        parallelism each device holds half of each model (vLLM's draft TP is the target's)."""
        target, draft, h = main.MODELS["llama-3.1-70b"], main.MODELS["llama-3.1-8b"], main.HARDWARE["h200-141gb"]
        for tp in (2, 4):
            with self.subTest(tp=tp):
                spec = main.RunSpec(hardware=h, model=target, tensor_parallel_size=tp, speculative_tokens=4,
                                    draft_model=draft)
                plan, _ = main.device_plan(spec, h)
                free = h.memory_gib * main.GIB * 0.9 - (target.weight_bytes + draft.weight_bytes) / tp \
                    - h.reserve_gib * main.GIB
                per_token = (target.kv_bytes_per_token + draft.kv_bytes_per_token) / tp
                self.assertEqual(plan.num_blocks, int(free // (16 * per_token)))
        # A host tier and a hand-off move whole blocks, both models' KV: a draft as large as the
        # target halves what a tier of the same size holds.
        spec = main.RunSpec(prefix_caching=True, kv_offloading_size=10, speculative_tokens=4)
        alone = main.host_tier(spec, main.device_plan(spec, spec.hardware)[0]).capacity
        drafted = main.replace(spec, draft_model=spec.model)
        self.assertEqual(main.host_tier(drafted, main.device_plan(drafted, spec.hardware)[0]).capacity, alone // 2)


class CompareASimulation(unittest.TestCase):
    def test_a_simulate_report_compared_with_itself_agrees(self):
        # helper-68: its engine, parallelism, cost model and memory share were dropped (ttft +109% at -tp 2)
        for flags in (("--engine", "sglang"), ("-tp", "2"), ("--cost-model", "kernels", "--gpu-memory-utilization",
                                                               "0.5", "--block-size", "32", "--prefix-caching"),
                      ("--max-tokens-in-flight", "3000"), ("--batching", "static"),      # (helper-69)
                      ("--gpus-per-node", "1", "-tp", "2"),
                      # helper-70: a fixed cache, speculative decoding and requests refused as too long
                      ("--kv-tokens", "20000", "--rate", "20"), ("--num-gpu-blocks", "1500", "--rate", "20"),
                      ("--speculative-tokens", "3", "--rate", "20"),
                      ("--speculative-tokens", "2", "--draft-model", "qwen3-8b", "--model", "qwen3-32b",
                       "--hardware", "h200-141gb"),
                      ("--max-model-len", "900",)):
            with self.subTest(flags=flags), tempfile.TemporaryDirectory() as tmp:
                code, out, err = call_cli("simulate", "--requests", "48", "--rate", "8", *flags, "--detailed", "--json")
                # (1: requests too long for --max-model-len failed)
                self.assertEqual(code, 1 if "--max-model-len" in flags else 0, err)
                path = os.path.join(tmp, "run.json")
                with open(path, "w") as f:
                    f.write(out)
                code, out, err = call_cli("compare", path, "--json")
                self.assertEqual(code, 0, err)
                rows = json.loads(out)["rows"]
                for key in ("out tok/s", "ttft mean ms", "tpot mean ms"):
                    self.assertAlmostEqual(rows[key]["error"], 0.0, places=6, msg=key)


class Compare(unittest.TestCase):
    """The published LLMServingSim runs, one at a time (validate scores the whole corpus)."""

    def errors(self, *flags):
        code, out, err = call_cli("compare", *flags, "--json")
        self.assertEqual(code, 0, err)
        rows = json.loads(out)["rows"]
        return {name: rows[name]["error"] for name in ("out tok/s", "tpot mean ms", "ttft mean ms", "e2e mean ms")}

    def test_the_kernel_model_predicts_the_kv_saturated_4090_run_within_the_bounds(self):
        """Within issue 18's bar for any one run, 25% on throughput and TPOT. KERNEL_SCALE is fitted on
        every source, this one's included; validate scores it with the fit from the others alone."""
        e = self.errors(os.path.join(RUNS, "rtx4090-llama-3.1-8b"), "--cost-model", "kernels")
        self.assertLess(abs(e["out tok/s"]), 0.25)
        self.assertLess(abs(e["tpot mean ms"]), 0.25)
        self.assertLess(abs(e["e2e mean ms"]), 0.25)

    def test_the_lessons_roofline_misses_it_as_the_issue_reported(self):
        e = self.errors(os.path.join(RUNS, "rtx4090-llama-3.1-8b"), "--cost-model", "roofline")
        self.assertLess(e["out tok/s"], -0.20)
        self.assertGreater(e["ttft mean ms"], 0.35)

    def test_both_stay_within_the_bounds_on_the_run_that_is_never_kv_bound(self):
        for model in ("kernels", "roofline"):
            with self.subTest(model=model):
                e = self.errors(os.path.join(RUNS, "rtxpro6000-llama-3.1-8b"), "--hardware", "rtx-pro-6000-96gb",
                                "--prefix-caching", "on", "--scheduler-reserve-full-isl", "on", "--cost-model", model)
                self.assertLess(max(abs(e["out tok/s"]), abs(e["tpot mean ms"])), 0.10)
                self.assertLess(abs(e["e2e mean ms"]), 0.15)
                self.assertLess(abs(e["ttft mean ms"]), 0.20)

    def test_a_simulated_run_compared_with_itself_has_no_error(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "run.json")
            code, out, _ = call_cli("simulate", "--hardware", "l4-24gb", "--requests", "40", "--rate", "2", "--detailed")
            with open(path, "w") as f:
                f.write(out)
            e = self.errors(path, "--hardware", "l4-24gb", "--model", "llama-3.1-8b", "--max-num-batched-tokens", "8192")
        for name, error in e.items():
            self.assertAlmostEqual(error, 0.0, places=9, msg=name)

    def test_a_loadgen_report_carries_the_servers_shape_and_compare_simulates_it(self):
        report = {"input_lens": [100] * 6, "output_lens": [20] * 6, "ttfts": [0.05] * 6, "itls": [[0.01] * 19] * 6,
                  "errors": [""] * 6, "start_times": [0.0, 0.1, 0.2, 0.3, 0.4, 0.5], "config": {"max_concurrency": 2}}
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "run.json")
            flags = ("--hardware", "cpu-4vcpu", "--model", "smollm2-135m-q8_0", "--json")
            for shape, said, code_wanted in (
                    ({"max_num_seqs": 4, "kv_tokens": 4096, "max_num_batched_tokens": 2048}, "4 slots, 4,096 KV tokens", 0),
                    ({"unknown": "no llama.cpp /props (HTTP 404)"}, "servesim's defaults stand in", 0),
                    ([4, 4096, 2048], "server.shape must be objects", 2),
                    # A cache smaller than one request: nothing simulated completes, and a comparison is exit 1.
                    ({"max_num_seqs": 4, "kv_tokens": 64, "max_num_batched_tokens": 2048},
                     "none of the 6 simulated requests completed", 1)):
                with self.subTest(shape=shape):
                    with open(path, "w") as f:
                        json.dump({**report, "server": {"shape": shape}}, f)
                    code, out, err = call_cli("compare", path, *flags)
                    self.assertEqual(code, code_wanted, err)
                    self.assertIn(said, err)
                    if code == 0 and isinstance(shape, dict) and "kv_tokens" in shape:
                        self.assertEqual(json.loads(out)["servesim"]["config"]["max_num_seqs"], 4)

    def test_a_bench_result_without_start_times_uses_its_rate_and_says_so(self):
        report = {"input_lens": [100, 200], "output_lens": [10, 20], "ttfts": [0.05, 0.06], "itls": [[0.01] * 9, [0.01] * 19],
                  "errors": ["", ""], "request_rate": 4.0}
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "bench.json")
            with open(path, "w") as f:
                json.dump(report, f)
            code, out, err = call_cli("compare", path, "--hardware", "h100-sxm-80gb", "--model", "llama-3.1-8b")
            self.assertEqual(code, 0, err)
            self.assertIn("Poisson arrivals at its request_rate", err)
            del report["request_rate"]
            with open(path, "w") as f:
                json.dump(report, f)
            code, _, err = call_cli("compare", path, "--hardware", "h100-sxm-80gb", "--model", "llama-3.1-8b")
            self.assertEqual(code, 2)
            self.assertIn("start_times", err)

    def test_the_timeline_has_vllms_columns_one_row_per_second(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "timeline.csv")
            code, out, err = call_cli("compare", os.path.join(RUNS, "rtx4090-llama-3.1-8b"), "--cost-model", "kernels",
                                      "--timeline", path, "--json")
            self.assertEqual(code, 0, err)
            duration = json.loads(out)["servesim"]["duration"]
            with open(path) as f:
                rows = list(csv.DictReader(f))
        self.assertEqual(list(rows[0]), ["t", "prompt_throughput", "gen_throughput", "running", "waiting", "kv_cache_pct"])
        self.assertEqual(len(rows), math.ceil(duration))
        self.assertEqual(sum(float(r["prompt_throughput"]) for r in rows), 257239)    # every prompt, once
        self.assertEqual(sum(float(r["gen_throughput"]) for r in rows), 195753)

    def test_an_unknown_device_needs_hardware_and_says_so(self):
        code, _, err = call_cli("compare", os.path.join(RUNS, "rtxpro6000-llama-3.1-8b"))
        self.assertEqual(code, 2)
        self.assertIn("--hardware", err)


class BlocksFromAVllmLog(unittest.TestCase):
    def test_num_gpu_blocks_is_accepted_whenever_it_fits_after_the_weights(self):
        with tempfile.TemporaryDirectory() as tmp:
            device = os.path.join(tmp, "4090.json")
            with open(device, "w") as f:            # the issue's case: the memory the run's device reported
                json.dump({"name": "rtx-4090-measured", "memory_gib": 25250627584 / 2**30, "bandwidth_gbs": 1008,
                           "tflops": 165.2}, f)
            code, out, err = call_cli("capacity", "--hardware", device, "--num-gpu-blocks", "2588", "--max-model-len", "32768")
            self.assertEqual(code, 0, err)
            self.assertIn("GPU KV cache size: 41,408 tokens", out)
            self.assertIn("leaves 1.15 GiB", err)
            code, _, err = call_cli("capacity", "--hardware", device, "--num-gpu-blocks", "3200")   # 6.7 GB > 6.66
            self.assertEqual(code, 1)
            self.assertIn("does not fit", err)


if __name__ == "__main__":
    unittest.main()
