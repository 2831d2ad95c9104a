"""The event engine against the per-step rule it must equal. The per-step Scheduler is the
lesson's rule, read as written; the EventScheduler and EventEngine skip the requests and steps
where nothing happens. On random small cases, chosen to hit every rule (tiny caches that force
preemption, tiny budgets that cut the running list, block sizes of 1, prefix caching, closed
and open loop, disaggregation, replicas behind each router, tensor and expert parallelism, reasoning
models whose decodes wake for their first answer token, TensorRT-LLM's and SGLang's rules,
speculative decoding, warm-up requests, the kernel cost model, per-second timelines), both must
print the same report to the last bit, per-request arrays included."""
import json
import random
import unittest

from helpers import main

CASES = 400
SEED = 2026


def random_spec(rng: random.Random) -> main.RunSpec:
    prompt_low = rng.randint(1, 40)
    output_low = rng.randint(1, 30)
    prefix = rng.choice([0, 0, rng.randint(1, 48)])
    spec = dict(
        block_size=rng.choice([1, 2, 3, 4, 8, 16]),
        kv_tokens=rng.choice([None, rng.randint(64, 600), rng.randint(600, 4000)]),
        max_num_seqs=rng.choice([1, 2, 3, 8, 64, 256]),
        max_num_batched_tokens=rng.choice([rng.randint(1, 16), rng.randint(16, 200), 8192]),
        chunked_prefill=rng.random() < 0.8,
        prefix_caching=rng.random() < 0.5,
        reserve_full_isl=rng.random() < 0.2,
        requests=rng.randint(1, 40),
        prompt_tokens=main.TokenRange(prompt_low, prompt_low + rng.randint(0, 200)),
        output_tokens=main.TokenRange(output_low, output_low + rng.randint(0, 120)),
        prefix_tokens=prefix, num_prefixes=rng.randint(1, 3),
        seed=rng.randint(0, 10**6), detailed=True,
    )
    arrivals = rng.random()
    if arrivals < 0.4:
        spec["concurrency"] = rng.randint(1, 50)
    else:
        spec["rate"] = rng.choice([5.0, 50.0, 500.0, 5000.0])
    variation = rng.random()
    if variation < 0.15:
        spec.update(disaggregate=True, kv_link_gbs=rng.choice([0.5, 5.0, 50.0]))
    elif variation < 0.25:
        spec.update(max_tokens_in_flight=rng.randint(100, 2000))
    elif variation < 0.32 and not spec["prefix_caching"]:
        spec.update(kv_layout="slots", kv_tokens=rng.randint(500, 5000), max_num_seqs=rng.randint(1, 8))
    if variation >= 0.32 and rng.random() < 0.3:      # replicas behind each router, tensor parallel, experts
        spec.update(data_parallel_size=rng.randint(2, 3), router=rng.choice(main.ROUTERS))
        if rng.random() < 0.4:
            spec.update(model=main.MODELS["qwen3-30b-a3b"], enable_expert_parallel=rng.random() < 0.7)
    if variation >= 0.32 and rng.random() < 0.2 and not spec.get("enable_expert_parallel"):
        spec.update(tensor_parallel_size=2)
    if rng.random() < 0.25:      # conversations: each turn is sent when the one before it ends
        spec.update(turns=rng.randint(2, 4), think_time=rng.choice([0.0, 0.01, 0.5]))
    if "rate" in spec and rng.random() < 0.2:
        spec.update(burstiness=rng.choice([0.3, 4.0]))
    engine = rng.random()
    if engine < 0.2:      # TensorRT-LLM's admission, in a cache small enough for it to bind
        spec.update(engine="trtllm", kv_tokens=rng.randint(200, 1200))
    elif engine < 0.35:   # SGLang's steps: prefill apart from decodes
        spec.update(engine="sglang")
    if spec["prefix_caching"] and not spec.get("disaggregate") and spec.get("kv_layout") != "slots" \
            and rng.random() < 0.9:      # a host tier (stepped by the per-step rule either way)
        spec.update(kv_offloading_size=rng.choice([0.002, 0.02, 0.2]))
        if "turns" not in spec and rng.random() < 0.5:     # histories come back after HBM evicted them
            spec.update(turns=rng.randint(2, 4), think_time=rng.choice([0.0, 0.5]))
    if output_low > 1 and "turns" not in spec and rng.random() < 0.3:   # a reasoning model: decodes wake to answer
        low = rng.randint(1, output_low - 1)
        spec.update(reasoning_tokens=main.TokenRange(low, rng.randint(low, output_low - 1)))
    if spec["requests"] > 2 and rng.random() < 0.2:    # the first requests left out of the metrics
        spec.update(warmup=rng.randint(1, spec["requests"] // 2))
    if rng.random() < 0.15 and not spec.get("disaggregate") and spec.get("kv_layout") != "slots" \
            and "kv_offloading_size" not in spec and spec.get("engine") != "trtllm":
        spec.update(speculative_tokens=rng.randint(1, 4), acceptance_rate=rng.choice([0.0, 0.5, 0.9]))
    if rng.random() < 0.2:
        spec.update(cost_model="kernels")
    return main.RunSpec(**spec)


def outcome(spec: main.RunSpec, timeline: bool = False) -> str:
    try:
        return json.dumps(main.run(spec, timeline=timeline), sort_keys=True)
    except (main.UserError, main.CapacityError) as e:
        return f"{type(e).__name__}: {e}"


class EventEngineEqualsThePerStepRule(unittest.TestCase):
    def test_random_cases_print_the_same_report(self):
        rng = random.Random(SEED)
        for case in range(CASES):
            spec = random_spec(rng)
            timeline = rng.random() < 0.2      # per-second snapshots, taken inside the plain-step loop
            with self.subTest(case=case, spec=spec, timeline=timeline):
                step = outcome(main.replace(spec, simulator="step"), timeline)
                event = outcome(main.replace(spec, simulator="event"), timeline)
                self.assertEqual(event, step)

    def test_the_random_cases_reach_every_rule(self):
        """The comparison above means something only if the cases preempt, cut the running
        list short, hit the prefix cache, reject, and coast through plain steps."""
        rng = random.Random(SEED)
        seen = {"preempted": 0, "prefix hits": 0, "failed": 0, "evictions": 0, "per-step fallback": 0,
                "coasted": 0, "replicas": 0, "tensor parallel": 0, "expert parallel": 0,
                "held back for its whole output": 0, "prefilled apart": 0, "answered after thinking": 0, "loaded from host memory": 0,
                "speculative": 0, "warm-up left out": 0, "kernel cost model": 0, "ended in a plain step": 0}
        fallback, advance, let_go = main.EventScheduler.per_step, main.EventEngine.advance, main.EventScheduler.let_go

        def counting_fallback(scheduler, now):
            seen["per-step fallback"] += 1
            return fallback(scheduler, now)

        def counting_advance(engine, until):
            steps = engine.stats.steps
            advance(engine, until)
            seen["coasted"] += engine.stats.steps - steps > 1

        def counting_let_go(scheduler, step):
            seen["ended in a plain step"] += 1
            let_go(scheduler, step)

        main.EventScheduler.per_step, main.EventEngine.advance = counting_fallback, counting_advance
        main.EventScheduler.let_go = counting_let_go
        try:
            for _ in range(CASES):
                spec = random_spec(rng)
                try:
                    result = main.run(spec)
                except (main.UserError, main.CapacityError):
                    continue
                seen["preempted"] += result["engine"]["preemptions"] > 0
                seen["prefix hits"] += result["engine"]["prefix_hit_rate"] > 0
                seen["failed"] += result["failed"] > 0
                seen["evictions"] += result["engine"]["evictions"] > 0
                seen["replicas"] += "replicas" in result
                seen["tensor parallel"] += spec.tensor_parallel_size > 1
                seen["expert parallel"] += spec.enable_expert_parallel
                seen["answered after thinking"] += bool(result.get("ttfas")) and result["ttfas"] != result["ttfts"]
                seen["loaded from host memory"] += bool(result.get("host_tier", {}).get("loads"))
                seen["speculative"] += bool(result.get("speculative", {}).get("verify_steps"))
                seen["warm-up left out"] += spec.warmup > 0
                seen["kernel cost model"] += spec.cost_model == "kernels"
                if spec.engine in ("trtllm", "sglang"):     # their rules changed what vLLM's would have done
                    plain = main.run(main.replace(spec, engine=None))
                    seen["held back for its whole output" if spec.engine == "trtllm" else "prefilled apart"] += \
                        result["ttfts"] != plain["ttfts"]
        finally:
            main.EventScheduler.per_step, main.EventEngine.advance, main.EventScheduler.let_go = fallback, advance, let_go
        for what, count in seen.items():
            self.assertGreater(count, 5 if what == "expert parallel" else 10, what)


class SpeculativeCruiseEqualsItsRule(unittest.TestCase):
    """Speculative decoding's event scheduler (decodes cruise on runs drawn ahead, their steps
    summed per step) against SpeculativeScheduler, on the random cases above with speculative
    decoding forced on: every K and acceptance, a draft model or none, every mix the random cases
    draw that has no prefix cache (which keeps it on the per-step rule)."""

    def test_random_speculative_cases_print_the_same_report(self):
        rng = random.Random(SEED + 1)
        cruised, cruise = 0, main.SpeculativeCruise.cruise

        def counting_cruise(scheduler, request, wake):
            nonlocal cruised
            cruised += 1
            cruise(scheduler, request, wake)
        self.addCleanup(setattr, main.SpeculativeCruise, "cruise", cruise)
        main.SpeculativeCruise.cruise = counting_cruise
        valid = 0
        for case in range(250):
            spec = main.replace(random_spec(rng), prefix_caching=False, kv_offloading_size=0.0,
                                speculative_tokens=rng.randint(1, 6),
                                acceptance_rate=rng.choice([0.0, 0.3, 0.7, 0.9, 1.0]),
                                draft_model=rng.choice([None, main.MODELS["smollm2-135m-q8_0"]]))
            if spec.draft_model:      # a small draft sharing the target's tokenizer, as a draft must
                spec = main.replace(spec, draft_model=main.replace(spec.draft_model, vocab_size=spec.model.vocab_size))
            timeline = rng.random() < 0.2
            with self.subTest(case=case, spec=spec, timeline=timeline):
                step = outcome(main.replace(spec, simulator="step"), timeline)
                event = outcome(spec, timeline)
                self.assertEqual(event, step)
                if step.startswith("{") and not main.lockstep(spec.data_parallel_size, spec.model,
                                                              main.engine_profile(spec)):
                    engines, _ = main.build_engines(spec)
                    self.assertIsInstance(engines[-1].scheduler, main.SpeculativeCruise)
                    valid += 1
        self.assertGreater(valid, 100)
        self.assertGreater(cruised, 1000)

    def test_a_requests_runs_are_its_own(self):
        """The same request accepts the same runs whatever else runs beside it: which of its
        tokens came together (a zero gap) is the same alone and among others, on either engine."""
        def together(spec):
            result = main.run(spec)
            return sorted(tuple(gap == 0 for gap in gaps) for gaps in result["itls"])
        alone = main.RunSpec(concurrency=1, requests=6, speculative_tokens=4, seed=7, detailed=True,
                             output_tokens=main.TokenRange(40, 300))
        self.assertEqual(together(alone), together(main.replace(alone, concurrency=3)))
        self.assertEqual(together(alone), together(main.replace(alone, concurrency=6, simulator="step")))
        self.assertNotEqual(together(alone), together(main.replace(alone, seed=-7)))   # seeds stay apart
        self.assertTrue(any(any(groups) for groups in together(alone)))

    def test_a_cruise_planned_in_pieces_and_its_lists_trimmed_print_the_same_report(self):
        """Short horizons (a decode wakes to plan again) and lists trimmed while decodes cruise."""
        cases = [main.RunSpec(concurrency=c, requests=12, speculative_tokens=4, output_tokens=main.TokenRange(300, 1500),
                              detailed=True, seed=c) for c in (1, 5)]
        horizon, keep = main.SpeculativeCruise.horizon, main.SpeculativeCruise.keep_steps
        self.addCleanup(setattr, main.SpeculativeCruise, "horizon", horizon)
        self.addCleanup(setattr, main.SpeculativeCruise, "keep_steps", keep)
        main.SpeculativeCruise.horizon, main.SpeculativeCruise.keep_steps = 7, 16
        for spec in cases:
            with self.subTest(spec=spec):
                self.assertEqual(outcome(spec), outcome(main.replace(spec, simulator="step")))


class CachedHeadMayFitLater(unittest.TestCase):
    def test_a_refused_head_whose_cached_blocks_a_decode_evicts_is_looked_at_again(self):
        """Found by fuzzing: with prefix caching, a decode growing into a block can evict one of
        the waiting head's cached blocks; its next chunk then needs fewer new blocks and it is
        admitted, by the rule, before anyone wakes. The event engine must not coast past that."""
        spec = main.RunSpec(kv_tokens=208, max_num_seqs=2, max_num_batched_tokens=81, prefix_caching=True,
                            disaggregate=True, requests=6, prompt_tokens=main.TokenRange(1, 114),
                            output_tokens=main.TokenRange(1, 52), prefix_tokens=18, num_prefixes=3, rate=5000,
                            seed=804769)
        self.assertEqual(outcome(spec), outcome(main.replace(spec, simulator="step")))


class EndsLetGoInRunningOrder(unittest.TestCase):
    def test_decodes_ending_in_a_plain_step_free_their_blocks_in_running_order(self):
        """Found by fuzzing: a reasoning model's decode re-joins the cruise after its first answer
        token, after decodes admitted later than it joined, and may end in the same step as they
        do. With prefix caching the order they free their blocks decides what is evicted first,
        so the plain step that lets them go must free them in running order, as the rule does."""
        spec = main.RunSpec(block_size=2, kv_tokens=344, requests=23, prompt_tokens=main.TokenRange(1, 14),
                            output_tokens=main.TokenRange(4, 24), reasoning_tokens=main.TokenRange(1, 3),
                            prefix_tokens=10, num_prefixes=4, prefix_caching=True, rate=5000,
                            max_num_batched_tokens=200, seed=662401, detailed=True)
        self.assertEqual(outcome(spec), outcome(main.replace(spec, simulator="step")))


class NoModeSpins(unittest.TestCase):
    """A request that can never be admitted under the active mode is failed with a reason; the
    engine never steps forever. Sizes straddle the cache by one token either way."""

    def test_every_mode_at_every_edge_size_ends(self):
        cache, block = 1024, 16
        modes = {
            "paged": {}, "no chunked prefill": {"chunked_prefill": False, "max_num_batched_tokens": cache},
            "reserve full isl": {"reserve_full_isl": True}, "prefix caching": {"prefix_caching": True},
            "static": {"batching": "static"}, "slots": {"kv_layout": "slots", "max_num_seqs": 1},
            "in-flight cap": {"max_tokens_in_flight": cache}, "disaggregated": {"disaggregate": True},
            "sglang": {"engine": "sglang"}, "trtllm": {"engine": "trtllm"},
        }
        steps = 0
        original = main.Engine.step

        def counted(engine):
            nonlocal steps
            steps += 1
            self.assertLess(steps, 100_000, "the engine is spinning")
            return original(engine)

        main.Engine.step = counted
        try:
            for name, mode in modes.items():
                for total in (cache - 1, cache, cache + 1, cache + block, 2 * cache):
                    for engine in ("step", "event"):
                        with self.subTest(mode=name, total=total, engine=engine):
                            steps = 0
                            spec = main.RunSpec(kv_tokens=cache, block_size=block, requests=2, simulator=engine,
                                                prompt_tokens=main.TokenRange(total - 25, total - 25),
                                                output_tokens=main.TokenRange(25, 25), concurrency=2, **mode)
                            result = main.run(spec)
                            self.assertEqual(result["completed"] + result["failed"], 2)
                            for kind in result["errors_by_kind"]:
                                self.assertNotEqual(kind, "cannot be scheduled",
                                                    f"{name}: its rejection rule missed a request it cannot run")
                            if result["failed"]:
                                self.assertGreaterEqual(total, cache, f"{name} failed a request that fits")
        finally:
            main.Engine.step = original


class NoEvictSumsOncePerChange(unittest.TestCase):
    def test_the_kept_shortfall_gives_the_rules_verdict_at_every_admission(self):
        """TensorRT-LLM's admission works the running requests' shortfall out from a running sum
        and the pool's counts instead of summing over the running requests; at every admission of
        random cases, both engines, it must say what the sum taken then says."""
        kept = main.NoEvict.admissible
        checked = refused = 0

        def against_the_sum(scheduler, request, hits, need):
            nonlocal checked, refused
            verdict = kept(scheduler, request, hits, need)
            owed = sum(scheduler.blocks_for(r.total - 1) - len(r.blocks) for r in scheduler.running)
            # Blocks the event engine took off the free list for cruising decodes, not yet handed
            # to them: the pool counts them used, the sum above counts them owed.
            prepaid = len(getattr(scheduler, "prepaid", ()))
            rule = super(main.NoEvict, scheduler).admissible(request, hits, need) and \
                scheduler.blocks_for(request.total - 1) - len(hits) + owed <= scheduler.pool.free_count() + prepaid
            self.assertEqual(verdict, rule)
            checked += 1
            refused += not rule
            return verdict

        main.NoEvict.admissible = against_the_sum
        try:
            rng = random.Random(SEED)
            for case in range(150):
                spec = main.replace(random_spec(rng), engine="trtllm", kv_tokens=rng.randint(200, 1200))
                for simulator in ("step", "event"):
                    with self.subTest(case=case, simulator=simulator):
                        outcome(main.replace(spec, simulator=simulator))
        finally:
            main.NoEvict.admissible = kept
        self.assertGreater(refused, 100)
        self.assertGreater(checked - refused, 100)


if __name__ == "__main__":
    unittest.main()


class PlainStepsPricedAsTheRulePricesThem(unittest.TestCase):
    def test_a_decode_steps_price_from_the_context_alone_is_step_seconds_to_the_last_bit(self):
        """The event engine prices a run of plain steps with decode_pricing(n), worked out once
        for the batch; it must give step_seconds(n, context, n, context) exactly, for every cost
        model and every way a step is split over GPUs."""
        rng = random.Random(SEED)
        for case in range(60):
            spec = random_spec(rng)
            if rng.random() < 0.5:
                spec = main.replace(spec, cost_model=rng.choice(["roofline", "kernels"]))
            if rng.random() < 0.2:
                spec = main.replace(spec, model=main.MODELS["llama-3.1-70b"], pipeline_parallel_size=2,
                                    hardware=main.HARDWARE["h100-sxm-80gb"], enable_expert_parallel=False)
            try:
                _, cost = main.device_plan(spec, spec.hardware)
            except (main.UserError, main.CapacityError):
                continue
            for n in (1, 2, 7, 64, 300):
                price = cost.decode_pricing(n)
                for context in (n, 17 * n, rng.randint(n, 10**6), 3 * 10**6):
                    with self.subTest(case=case, cost=type(cost).__name__, n=n, context=context):
                        self.assertEqual(price(context).hex(), float(cost.step_seconds(n, context, n, context)).hex())
