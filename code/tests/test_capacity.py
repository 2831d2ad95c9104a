import json
import re
import unittest

from helpers import main, run_cli


class Step9Capacity(unittest.TestCase):
    """The lesson's Step 9 capacity output for Llama 3.1 8B on an L4, figure for figure."""

    def setUp(self):     # the lesson counts max concurrency at 4,096 tokens
        self.code, self.out, self.err = run_cli("capacity", "--hardware", "l4-24gb", "--max-model-len", "4096")

    def line(self, label):
        return next(l for l in self.out.splitlines() if l.startswith(label))

    def test_prints_every_step9_figure(self):
        self.assertEqual(self.code, 0, self.err)
        self.assertIn("16.06 GB", self.line("weights"))
        self.assertIn("8.03 B params x 2 bytes", self.line("weights"))
        self.assertIn("128.0 KiB", self.line("kv per token"))
        self.assertIn("2 x 32 layers x 8 kv heads x 128 head dim x 2 bytes", self.line("kv per token"))
        self.assertIn("20.25 GiB", self.line("memory budget"))
        self.assertIn("22.5 GiB x 0.90", self.line("memory budget"))
        self.assertIn("3.79 GiB", self.line("kv cache"))
        self.assertIn("1.5 GiB reserve", self.line("kv cache"))
        self.assertIn("1,941 x 16 tokens", self.line("blocks"))
        self.assertIn("= 31,056 tokens", self.line("blocks"))
        self.assertIn("7.58x", self.line("max concurrency"))
        self.assertIn("at 4,096 tokens per request", self.line("max concurrency"))
        self.assertIn("72.38 ms at batch 1", self.line("decode step"))
        self.assertIn("~269 tokens per step", self.line("decode step"))

    def test_prints_vllms_startup_line_for_the_same_plan(self):
        self.assertIn("GPU KV cache size: 31,056 tokens, Maximum concurrency for 4,096 tokens per request: 7.58x",
                      self.out)


class ModelLength(unittest.TestCase):
    """--max-model-len defaults to the model's own length, as vLLM's does (issue 20 finding 26)."""

    def test_the_default_is_the_models_max_position_embeddings(self):
        for model, length in (("llama-3.1-8b", 131072), ("qwen3-8b", 40960), ("smollm2-135m-q8_0", 8192)):
            with self.subTest(model):
                code, out, err = run_cli("capacity", "--model", model, "--json")
                self.assertEqual(code, 0, err)
                self.assertEqual(json.loads(out)["max_model_len"], length)

    def test_a_model_file_without_a_length_keeps_4096(self):
        import os
        import tempfile
        fields = {k: v for k, v in main.preset_fields(main.MODELS["llama-3.1-8b"]).items()
                  if k != "max_position_embeddings"}
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "model.json")
            with open(path, "w") as f:
                json.dump(fields, f)
            code, out, err = run_cli("capacity", "--model", path, "--json")
        self.assertEqual(code, 0, err)
        self.assertEqual(json.loads(out)["max_model_len"], 4096)

    def test_vllm_would_refuse_to_start_when_one_request_of_that_length_does_not_fit(self):
        code, out, err = run_cli("capacity", "--hardware", "l4-24gb")
        self.assertEqual(code, 0, err)
        self.assertIn("0.24x               at 131,072 tokens per request", out)
        self.assertIn("vllm would stop  one request of 131,072 tokens (the model's own length unless --max-model-len "
                      "says) does not fit its 31,056-token KV cache; vLLM needs --max-model-len 31056 or less", out)
        self.assertNotIn("vllm would log", out)
        # helper-61: capacity called --block-size 7 startable where simulate did not, and --json said nothing
        for flags, said in ((("--block-size", "7"), "--block-size 7 is not one it takes"),
                            (("--max-model-len", "300000"), "--max-model-len 300,000 is longer than llama-3.1-8b's "
                                                            "own 131,072")):
            code, out, err = run_cli("capacity", *flags, "--json")
            self.assertEqual(code, 0, err)
            self.assertIn(said, json.loads(out)["vllm_would_refuse"])
            code, out, err = run_cli("simulate", "--requests", "3", *flags)
            self.assertIn(said, err)
        # a disaggregated run's prefill engine is checked too
        code, out, err = run_cli("simulate", "--requests", "3", "--prefill-hardware", "l4-24gb", "--json")
        self.assertIn("the prefill engine: vLLM would refuse to start this deployment: one request of 131,072",
                      json.loads(out)["config"]["vllm_would_refuse"])
        # helper-55: simulate ran it without a word; it still runs it, and says what vLLM would do.
        said = "vLLM would refuse to start this deployment: one request of 131,072 tokens"
        code, out, err = run_cli("simulate", "--hardware", "l4-24gb", "--requests", "5", "--json")
        self.assertEqual(code, 0, err)
        self.assertIn(said, err)
        self.assertIn("vLLM needs --max-model-len 31056 or less", json.loads(out)["config"]["vllm_would_refuse"])
        for flags in (("--max-model-len", "31056"), ("--engine", "sglang")):
            code, out, err = run_cli("simulate", "--hardware", "l4-24gb", "--requests", "5", *flags)
            self.assertEqual(code, 0, err)
            self.assertNotIn(said, err)

    def test_vllm_would_refuse_a_token_budget_below_the_sequences(self):
        said = "--max-num-batched-tokens 256 is below --max-num-seqs 512"
        code, out, err = run_cli("simulate", "--requests", "5", "--max-num-seqs", "512", "--max-num-batched-tokens",
                                 "256", "--json")
        self.assertEqual(code, 0, err)
        self.assertIn(f"vLLM would refuse to start this deployment: {said}", err)
        self.assertIn(said, json.loads(out)["config"]["vllm_would_refuse"])
        # Both reasons at once, in one line.
        code, _, err = run_cli("simulate", "--hardware", "l4-24gb", "--requests", "5", "--max-num-seqs", "512",
                               "--max-num-batched-tokens", "256")
        self.assertEqual(code, 0, err)
        self.assertEqual(err.count("vLLM would refuse"), 1, err)
        self.assertIn("31056 or less; and --max-num-batched-tokens 256", err)
        code, _, err = run_cli("simulate", "--requests", "5", "--block-size", "3")
        self.assertEqual(code, 0, err)
        self.assertIn("vLLM would refuse to start this deployment: --block-size 3 is not one it takes (1, 8, 16", err)
        for flags in (("--max-num-batched-tokens", "512"), ("--engine", "sglang")):
            code, out, err = run_cli("simulate", "--requests", "5", "--max-num-seqs", "512", *flags)
            self.assertEqual(code, 0, err)
            self.assertNotIn("would refuse", err)


class CriticalBatch(unittest.TestCase):
    def test_h100_knee_is_about_197_tokens_and_cpu_under_3(self):
        self.assertAlmostEqual(main.critical_batch(main.HARDWARE["h100-sxm-80gb"], main.MODELS["llama-3.1-8b"]), 197, delta=0.5)
        self.assertLess(main.critical_batch(main.HARDWARE["cpu-4vcpu"], main.MODELS["smollm2-135m-q8_0"]), 3)

    def test_decode_of_16_costs_barely_more_than_of_1(self):
        h, m = main.HARDWARE["h100-sxm-80gb"], main.MODELS["llama-3.1-8b"]
        one, sixteen = main.step_seconds(h, m, 1, 0), main.step_seconds(h, m, 16, 0)
        self.assertLess(sixteen / one, 1.01)
        self.assertGreater(main.step_seconds(h, m, 1000, 0), 2 * one)   # past the knee compute rules


class DoesNotFit(unittest.TestCase):
    def test_70b_on_one_h100_exits_1_naming_the_three_ways_out(self):
        code, out, err = run_cli("capacity", "--model", "llama-3.1-70b")
        self.assertEqual(code, 1)
        self.assertEqual(out, "")
        self.assertEqual(len(err.strip().splitlines()), 1)
        self.assertIn("weights 141.20 GB plus 2.0 GiB reserve exceed 71.64 GiB", err)
        for way in ("quantize", "tensor parallelism", "bigger device"):
            self.assertIn(way, err)

    def test_kv_tokens_beyond_the_memory_left_does_not_fit(self):
        code, _, err = run_cli("capacity", "--hardware", "l4-24gb", "--kv-tokens", "100000")
        self.assertEqual(code, 1)
        self.assertIn("does not fit", err)


class EngineMemoryRule(unittest.TestCase):
    """vLLM's --gpu-memory-utilization is a share of the whole device; TensorRT-LLM's
    kv_cache_free_gpu_mem_fraction a share of what the weights and activations leave."""

    def test_trtllms_fraction_is_of_the_memory_left_after_the_weights(self):
        h100, model = main.HARDWARE["h100-sxm-80gb"], main.quantized(main.MODELS["llama-3.1-8b"], "fp8")
        vllm = main.plan_capacity(h100, model, 0.9, 32, 2000)
        trtllm = main.plan_capacity(h100, model, 0.9, 32, 2000, of_free=True)
        left = h100.memory_gib * main.GIB - model.weight_bytes - h100.reserve_gib * main.GIB
        self.assertAlmostEqual(vllm.kv_cache_bytes / (32 * model.kv_bytes_per_token),
                               (0.9 * h100.memory_gib * main.GIB - model.weight_bytes - h100.reserve_gib * main.GIB)
                               // (32 * model.kv_bytes_per_token))
        self.assertEqual(trtllm.num_blocks, int(0.9 * left // (32 * model.kv_bytes_per_token)))
        self.assertGreater(trtllm.num_blocks, vllm.num_blocks)
        # A tenth of the device does not hold the weights; a tenth of what they leave is a cache.
        with self.assertRaises(main.CapacityError):
            main.plan_capacity(h100, model, 0.1, 32, 2000)
        self.assertEqual(main.plan_capacity(h100, model, 0.1, 32, 2000, of_free=True).num_blocks,
                         int(0.1 * left // (32 * model.kv_bytes_per_token)))

    def test_capacity_with_engine_trtllm_prints_its_fraction_and_not_vllms_startup_line(self):
        code, out, err = run_cli("capacity", "--engine", "trtllm", "--quantization", "fp8", "--max-model-len", "2000")
        self.assertEqual(code, 0, err)
        self.assertIn("kv_cache_free_gpu_mem_fraction 0.90", out)
        self.assertIn("less 0.10 of what the weights and activations leave", out)
        self.assertIn("x 32 tokens", out)                  # TensorRT-LLM's tokens_per_block
        self.assertNotIn("vllm would", out)
        self.assertIn(", engine trtllm", out.splitlines()[0])
        code, out, _ = run_cli("capacity", "--engine", "trtllm", "--max-model-len", "2000000")
        self.assertEqual(code, 0)
        self.assertIn("too long         one request of 2,000,000 tokens does not fit", out)
        code, out, _ = run_cli("capacity", "--engine", "trtllm", "--quantization", "fp8", "--json")
        self.assertEqual(json.loads(out)["gpu_memory_utilization_of"], "what the weights and activations leave")
        self.assertEqual(json.loads(out)["engine"], "trtllm")
        plain = json.loads(run_cli("capacity", "--json")[1])
        self.assertEqual((plain["gpu_memory_utilization_of"], plain["engine"]), ("device", None))

    def test_llamacpps_default_context_is_the_models_training_context(self):
        # helper-68: --engine llamacpp sized its cache from 90% of memory (641,584 tokens for SmolLM2 on
        # the CPU preset); llama-server's default --ctx-size 0 takes the model's 8,192
        spec = main.engine_defaults(main.RunSpec(engine="llamacpp", hardware=main.HARDWARE["cpu-4vcpu"],
                                                 model=main.MODELS["smollm2-135m-q8_0"]))
        plan, _ = main.device_plan(spec, spec.hardware)
        self.assertEqual((plan.kv_tokens, plan.source), (8192, "context"))
        plan, _ = main.device_plan(main.replace(spec, kv_tokens=4096), spec.hardware)     # -c 4096 given
        self.assertEqual(plan.kv_tokens, 4096)
        small = main.replace(spec, hardware=main.replace(spec.hardware, memory_gib=0.75))  # memory holds less
        self.assertLess(main.device_plan(small, small.hardware)[0].kv_tokens, 8192)

    def test_llamacpp_is_told_its_cache_is_its_ctx_size(self):
        code, out, _ = run_cli("capacity", "--engine", "llamacpp", "--hardware", "cpu-4vcpu", "--model", "smollm2-135m-q8_0")
        self.assertEqual(code, 0)
        self.assertIn("pass the server's --ctx-size as --kv-tokens", out)
        code, out, _ = run_cli("capacity", "--engine", "llamacpp", "--hardware", "cpu-4vcpu", "--model", "smollm2-135m-q8_0",
                               "--kv-tokens", "4096")
        self.assertNotIn("--ctx-size as --kv-tokens", out)

    def test_a_model_too_big_for_trtllm_names_the_device_memory(self):
        code, out, err = run_cli("capacity", "--engine", "trtllm", "--model", "llama-3.1-70b")
        self.assertEqual(code, 1)
        self.assertIn("weights 141.20 GB plus 2.0 GiB reserve exceed 79.6 GiB;", err)


class FixedSizes(unittest.TestCase):
    def test_kv_tokens_fixes_the_cache_like_llama_cpp_ctx_size(self):
        plan = main.plan_capacity(main.HARDWARE["cpu-4vcpu"], main.MODELS["smollm2-135m-q8_0"], kv_tokens=4096)
        self.assertEqual((plan.num_blocks, plan.kv_tokens), (256, 4096))

    def test_num_gpu_blocks_pins_the_count_from_a_vllm_log(self):
        code, out, _ = run_cli("capacity", "--num-gpu-blocks", "1000", "--max-model-len", "8192", "--json")
        self.assertEqual(code, 0)
        plan = json.loads(out)
        self.assertEqual(plan["num_blocks"], 1000)
        self.assertEqual(plan["kv_tokens"], 16000)
        self.assertAlmostEqual(plan["max_concurrency"], 1000 / 512)

    def test_kv_bytes_per_token_of_each_model(self):
        self.assertEqual(main.MODELS["llama-3.1-8b"].kv_bytes_per_token, 131072)
        self.assertEqual(main.MODELS["llama-3.1-70b"].kv_bytes_per_token, 327680)
        self.assertEqual(main.MODELS["smollm2-135m-q8_0"].kv_bytes_per_token, 23040)
        self.assertAlmostEqual(main.MODELS["smollm2-135m-q8_0"].weight_bytes, 134.5e6 * 34 / 32)


if __name__ == "__main__":
    unittest.main()


class WhatEachGpuHolds(unittest.TestCase):
    """helper-66: capacity could not show a draft model's share (so its blocks were twice simulate's),
    and a data-parallel mixture of experts' weights line did not add up."""

    def test_a_draft_model_is_in_the_plan_capacity_prints(self):
        flags = ("capacity", "--model", "qwen3-32b", "-tp", "2", "--max-model-len", "8192")
        code, out, err = run_cli(*flags, "--speculative-tokens", "4", "--draft-model", "qwen3-8b", "--json")
        self.assertEqual(code, 0, err)
        drafted = json.loads(out)
        code, out, err = run_cli("simulate", "--model", "qwen3-32b", "-tp", "2", "--max-model-len", "8192",
                                 "--speculative-tokens", "4", "--draft-model", "qwen3-8b", "--requests", "4", "--json")
        self.assertEqual(drafted["num_blocks"], json.loads(out)["engine"]["num_blocks"])
        self.assertEqual(drafted["draft_model"]["name"], "qwen3-8b")
        code, out, _ = run_cli(*flags, "--json")
        self.assertLess(drafted["num_blocks"], json.loads(out)["num_blocks"])
        code, out, _ = run_cli(*flags, "--speculative-tokens", "4", "--draft-model", "qwen3-8b")
        self.assertIn("budget - weights - the draft - 2 GiB reserve", out)

    def test_a_data_parallel_mixture_of_experts_weights_line_adds_up(self):
        code, out, err = run_cli("capacity", "--model", "qwen3-30b-a3b", "-dp", "2")
        self.assertEqual(code, 0, err)
        line = next(l for l in out.splitlines() if l.startswith("weights"))
        self.assertIn("experts x 2 bytes x 0.5 (its share of them over 2 ranks), the rest x 2", line)
        m = main.MODELS["qwen3-30b-a3b"]
        self.assertAlmostEqual(float(line.split()[1]), (m.shared_params * 2 + m.expert_params * 2 / 2) / 1e9, places=2)

    def test_a_pipeline_sweep_compares_per_gpu(self):
        code, out, err = run_cli("sweep", "-pp", "1,2", "--concurrency", "4", "--requests", "20")
        self.assertEqual(code, 0, err)
        header = out.splitlines()[1].split()
        self.assertIn("gpus", header)
        self.assertIn("$/M", header)


class SglangShare(unittest.TestCase):
    def test_sglangs_share_is_worked_out_from_the_device_and_holds_no_reserve(self):
        # helper-68: 0.88 of every device, with servesim's reserve taken inside it too
        for hardware, share in (("h100-sxm-80gb", 0.835), ("l4-24gb", 0.701), ("l40s-48gb", 0.851)):
            spec = main.engine_defaults(main.RunSpec(engine="sglang", hardware=main.HARDWARE[hardware]))
            self.assertEqual(spec.gpu_memory_utilization, share, hardware)
        h100 = main.HARDWARE["h100-sxm-80gb"]
        reserved = 512 + 8192 * 1.5 + 1024 / 8 + 256 * 2          # MB (above the 10 GiB floor)
        self.assertEqual(main.sglang_memory_share(main.RunSpec(hardware=h100)),
                         round((h100.memory_gib * 1024 - reserved) / (h100.memory_gib * 1024), 3))
        plan, _ = main.device_plan(main.engine_defaults(main.RunSpec(engine="sglang")), h100)
        self.assertAlmostEqual(plan.kv_cache_bytes, plan.budget_bytes - plan.model.weight_bytes,
                               delta=plan.block_size * plan.model.kv_bytes_per_token)
        # a flag given is the user's
        given = main.engine_defaults(main.RunSpec(engine="sglang", gpu_memory_utilization=0.9), {"gpu_memory_utilization"})
        self.assertEqual(given.gpu_memory_utilization, 0.9)
        # helper-69: each sweep point's device gets its own share (the first point's was kept); a chunk that
        # leaves no share is one line; a model that does not fit is not said to need servesim's reserve
        code, out, err = run_cli("sweep", "--engine", "sglang", "--hardware", "h100-sxm-80gb,l4-24gb", "--requests", "8",
                                 "--concurrency", "4", "--json")
        self.assertEqual(code, 0, err)
        self.assertEqual([(r["config"]["hardware"], r["config"]["gpu_memory_utilization"]) for r in json.loads(out)],
                         [("h100-sxm-80gb", 0.835), ("l4-24gb", 0.701)])
        code, _, err = run_cli("simulate", "--engine", "sglang", "--hardware", "l4-24gb", "--max-num-batched-tokens", "16384")
        self.assertEqual(code, 2)
        self.assertIn("leave SGLang no memory share", err)
        code, _, err = run_cli("simulate", "--engine", "sglang", "--model", "llama-3.1-70b")
        self.assertEqual(code, 1)
        self.assertIn("weights 141.20 GB exceed 66.47 GiB", err)
        # vLLM's no-chunked-prefill budget follows each point's --max-model-len
        code, out, err = run_cli("sweep", "--engine", "vllm", "--no-chunked-prefill", "--max-model-len", "4096,16384",
                                 "--requests", "4", "--json")
        self.assertEqual([r["config"]["max_num_batched_tokens"] for r in json.loads(out)], [8192, 16384])


class VllmOwnFigures(unittest.TestCase):
    """helper-72: what vLLM would say and refuse, for models stored quantized or with sliding layers."""

    def test_gpt_oss_startup_line_divides_the_pool_among_its_two_groups(self):
        # vllm/v1/core/kv_cache_utils.py: 18 full-attention and 18 sliding layers make two groups of
        # 18, one pool; the line's tokens are blocks // 2 x 16, and a 131,072-token request's worst
        # case holds 8,192 full blocks and cdiv(127 + 8,192, 16) + 1 = 521 sliding ones
        code, out, err = run_cli("capacity", "--model", "gpt-oss-120b")
        self.assertEqual(code, 0, err)
        self.assertIn("blocks           16,257 x 16 tokens", out)
        self.assertIn(f"GPU KV cache size: {16257 // 2 * 16:,} tokens, Maximum concurrency for 131,072 tokens per "
                      f"request: {16257 / (8192 + 521):.2f}x", out)
        self.assertIn("their concurrency is an upper bound", out)
        code, out, _ = run_cli("capacity")          # a model without sliding layers: the plan's own figures
        self.assertIn(f"GPU KV cache size: {re.search(r'= ([0-9,]+) tokens', out).group(1)} tokens", out)
        self.assertNotIn("sliding window", out)

    def test_a_checkpoint_stored_quantized_refuses_another_method(self):
        code, _, err = run_cli("capacity", "--model", "gpt-oss-120b", "--quantization", "fp8")
        self.assertEqual(code, 2)
        self.assertIn("gpt-oss-120b's checkpoint is quantized already", err)

    def test_each_engine_names_its_own_memory_share(self):
        titles = {engine: run_cli("capacity", "--engine", engine)[1].splitlines()[0] for engine in
                  ("vllm", "sglang", "trtllm", "llamacpp")}
        self.assertTrue(titles["vllm"].endswith("gpu-memory-utilization 0.90"))
        self.assertTrue(titles["sglang"].endswith("mem-fraction-static 0.83"))
        self.assertTrue(titles["trtllm"].endswith("kv_cache_free_gpu_mem_fraction 0.90"))
        self.assertTrue(titles["llamacpp"].endswith("engine llamacpp"), titles["llamacpp"])
