"""Each rule of the scheduler on a case small enough to work out on paper.
Blocks hold 4 tokens unless a test says otherwise."""
import unittest

from helpers import main

H100, LLAMA = main.HARDWARE["h100-sxm-80gb"], main.MODELS["llama-3.1-8b"]


def engine(blocks=100, block_size=4, **config):
    """An engine stepping the per-step rule (test_engine checks the event engine against it)."""
    return main.build_engines(main.RunSpec(num_gpu_blocks=blocks, block_size=block_size, simulator="step", **config))[0][0]


def req(id, prompt, output=10, **kw):
    return main.Request(id, prompt, output, **kw)


def put_running(e, request, computed, generated=0):
    """Hand-build a running request holding KV for `computed` tokens."""
    s = e.scheduler
    request.generated = generated
    request.blocks = s.pool.allocate(s.blocks_for(computed))
    request.computed = computed
    request.queue_s = 0.0
    request.admitted = next(s.admissions)
    s.running.append(request)
    return request


def tokens(batch):
    return {r.id: n for r, n in batch}


class RunningFirst(unittest.TestCase):
    def test_running_requests_go_first_then_waiting_ones_with_what_is_left(self):
        e = engine(max_num_batched_tokens=6)
        for r in (req("a", 4), req("b", 4)):
            e.scheduler.add(r)
        self.assertEqual(tokens(e.step()), {"a": 4, "b": 2})
        e.scheduler.add(req("c", 8))
        self.assertEqual(tokens(e.step()), {"a": 1, "b": 2, "c": 3})

    def test_when_the_budget_is_spent_later_running_requests_wait_unpreempted(self):
        e = engine(max_num_batched_tokens=8)
        put_running(e, req("long", 20), 0)
        put_running(e, req("decode", 4), 4, generated=1)
        self.assertEqual(tokens(e.step()), {"long": 8})
        self.assertEqual([r.id for r in e.scheduler.running], ["long", "decode"])
        self.assertEqual(e.scheduler.preemptions, 0)

    def test_a_readmitted_request_goes_to_the_end_of_the_running_order(self):
        e = engine()
        a, b = req("a", 4), req("b", 4)
        e.scheduler.add(a)
        e.scheduler.add(b)
        e.step()
        e.scheduler.preempt(a)
        e.step()                                          # b decodes, a is recomputed after it
        self.assertEqual([r.id for r, _ in e.step()], ["b", "a"])


class BlocksAndPreemption(unittest.TestCase):
    def test_a_block_shortage_preempts_the_last_admitted_request(self):
        e = engine(blocks=4)
        a = put_running(e, req("a", 8), 8, generated=1)
        b = put_running(e, req("b", 8), 8, generated=1)
        batch = e.step()
        self.assertEqual(tokens(batch), {"a": 1})
        self.assertEqual(len(a.blocks), 3)
        self.assertEqual((b.blocks, b.computed, b.preemptions), ([], 0, 1))
        self.assertEqual(e.scheduler.preemptions, 1)

    def test_the_asking_request_can_be_the_one_preempted(self):
        e = engine(blocks=4)
        put_running(e, req("a", 6), 6, generated=1)       # decodes inside its second block
        b = put_running(e, req("b", 8), 8, generated=1)   # needs a third block, none free
        self.assertEqual(tokens(e.step()), {"a": 1})
        self.assertEqual(list(e.scheduler.waiting), [b])
        self.assertEqual(b.preemptions, 1)

    def test_preemption_repeats_until_the_chunk_fits_all_or_nothing(self):
        e = engine(blocks=5, max_num_batched_tokens=8)
        a = put_running(e, req("a", 12), 4)               # wants 8 more tokens: 2 more blocks
        put_running(e, req("b", 4), 4, generated=1)       # 1 block, next token needs another
        put_running(e, req("c", 4), 4, generated=1)
        put_running(e, req("d", 4), 4, generated=1)
        put_running(e, req("e", 4), 4, generated=1)       # 5 blocks used, 0 free
        self.assertEqual(tokens(e.step()), {"a": 8})
        self.assertEqual([r.id for r in e.scheduler.waiting], ["d", "e"])   # e went first, then d
        self.assertEqual(a.computed, 12)

    def test_a_step_that_preempted_admits_nobody(self):
        e = engine(blocks=5)
        put_running(e, req("a", 8), 8, generated=1)
        put_running(e, req("b", 8), 8, generated=1)
        e.scheduler.add(req("small", 2))                             # one block would be free for it
        batch = e.step()
        self.assertEqual(tokens(batch), {"a": 1})
        self.assertEqual([r.id for r in e.scheduler.waiting], ["b", "small"])
        self.assertEqual(e.scheduler.pool.free_count(), 2)

    def test_preemption_releases_in_reverse_and_keeps_the_keys(self):
        e = engine(blocks=6, prefix_caching=True)
        b = req("b", 8, output=2)
        e.scheduler.add(b)
        e.step()                                           # b admitted, its 2 full blocks keyed
        blocks_of_b = list(b.blocks)
        e.scheduler.preempt(b)
        self.assertEqual(e.scheduler.pool.free_order()[-2:], blocks_of_b[::-1])
        self.assertEqual(e.scheduler.pool.lookup([("b", 0), ("b", 1)]), blocks_of_b)
        self.assertEqual(e.scheduler.waiting[0], b)
        self.assertEqual((b.computed, b.blocks), (0, []))

    def test_idle_cached_blocks_count_as_free_and_are_evicted_not_preempted(self):
        e = engine(blocks=4, prefix_caching=True)
        first = req("first", 12, output=1)
        e.scheduler.add(first)
        e.step()                                            # 3 blocks keyed, then released
        self.assertTrue(first.finished)
        self.assertEqual(e.scheduler.pool.free_count(), 4)
        e.scheduler.add(req("next", 14, output=1))
        e.step()
        self.assertEqual(e.scheduler.preemptions, 0)
        self.assertEqual(e.scheduler.pool.evictions, 3)


class Admission(unittest.TestCase):
    def test_the_head_of_the_queue_blocks_everyone_behind_it(self):
        e = engine(blocks=6)
        put_running(e, req("x", 8), 8, generated=1)         # 2 blocks held, a third this step
        e.scheduler.add(req("big", 16, output=2))                      # needs 4 blocks, 3 are free
        e.scheduler.add(req("small", 2))                               # needs 1, would fit
        self.assertEqual(tokens(e.step()), {"x": 1})

    def test_max_num_seqs_caps_the_batch(self):
        e = engine(max_num_seqs=2)
        for i in range(3):
            e.scheduler.add(req(i, 4))
        self.assertEqual(set(tokens(e.step())), {0, 1})

    def test_queue_time_runs_to_the_start_of_the_admitting_step(self):
        e = engine(max_num_seqs=1)
        a, b = req("a", 4, output=2), req("b", 4, output=2)
        e.scheduler.add(a)
        e.scheduler.add(b)
        e.step()
        e.step()                                             # a finishes here
        start = e.clock
        e.step()
        self.assertEqual(a.queue_s, 0.0)
        self.assertEqual(b.queue_s, start)

    def test_reserve_full_isl_needs_blocks_for_the_whole_prompt(self):
        for reserve, admitted in ((False, True), (True, False)):
            e = engine(blocks=8, max_num_batched_tokens=5, reserve_full_isl=reserve)
            put_running(e, req("x", 16), 16, generated=1)    # 4 blocks held, 4 free
            e.scheduler.add(req("long", 20))                            # first chunk 4 tokens, prompt 5 blocks
            self.assertEqual("long" in tokens(e.step()), admitted, reserve)


class PrefixCaching(unittest.TestCase):
    def test_hits_cost_no_compute_but_the_last_prompt_token_is_always_computed(self):
        e = engine(prefix_caching=True)
        e.scheduler.add(req(1, 8, content=(("s", 8),)))
        e.step()
        whole = req(2, 8, content=(("s", 8),))        # all of it cached, but 1 block reused
        longer = req(3, 12, content=(("s", 8),))      # 2 blocks reused, 4 tokens computed
        e.scheduler.add(whole)
        e.scheduler.add(longer)
        self.assertEqual(tokens(e.step()), {1: 1, 2: 4, 3: 4})

    def test_a_block_is_a_hit_in_the_same_step_that_fills_it(self):
        e = engine(prefix_caching=True)
        e.scheduler.add(req(1, 10, content=(("s", 8),)))
        e.scheduler.add(req(2, 10, content=(("s", 8),)))
        self.assertEqual(tokens(e.step()), {1: 10, 2: 2})
        # Hit rate counts tokens at first admission: 8 hit of 20 looked up.
        self.assertAlmostEqual(e.report(1.0)["prefix_hit_rate"], 0.4)

    def test_a_shared_prefix_is_stored_once(self):
        e = engine(prefix_caching=True)
        a = req(1, 10, content=(("s", 8),))
        b = req(2, 10, content=(("s", 8),))
        e.scheduler.add(a)
        e.scheduler.add(b)
        e.step()
        self.assertEqual(a.blocks[:2], b.blocks[:2])
        self.assertEqual(e.scheduler.pool.used_count(), 4)

    def test_a_preempted_request_rehits_its_own_blocks(self):
        e = engine(prefix_caching=True)
        r = req("r", 12)
        e.scheduler.add(r)
        e.step()                                              # 12 computed: 3 full blocks keyed
        e.scheduler.preempt(r)                                # length 13, 3 full blocks cached
        self.assertEqual(tokens(e.step()), {"r": 1})
        self.assertEqual(r.computed, 13)

    def test_without_prefix_caching_nothing_is_keyed(self):
        e = engine()
        e.scheduler.add(req(1, 10, content=(("s", 8),)))
        e.scheduler.add(req(2, 10, content=(("s", 8),)))
        self.assertEqual(tokens(e.step()), {1: 10, 2: 10})
        self.assertEqual(e.scheduler.pool.cached, {})


class Rejections(unittest.TestCase):
    def test_without_chunked_prefill_a_prompt_waits_until_all_of_it_fits(self):
        chunked, whole = engine(max_num_batched_tokens=10), engine(max_num_batched_tokens=10, chunked_prefill=False)
        for e in (chunked, whole):
            e.scheduler.add(req("a", 6, output=2))
            e.scheduler.add(req("b", 6, output=2))
        self.assertEqual(tokens(chunked.step()), {"a": 6, "b": 4})
        self.assertEqual(tokens(whole.step()), {"a": 6})

    def test_without_chunked_prefill_a_request_over_the_budget_fails(self):
        e = engine(max_num_batched_tokens=10, chunked_prefill=False)
        r = req("big", 12)
        e.scheduler.add(r)
        self.assertIn("--max-num-batched-tokens", r.error)
        self.assertEqual(e.scheduler.done, [r])
        self.assertFalse(e.has_work())

    def test_a_request_over_max_model_len_fails(self):
        e = engine(max_model_len=100)
        r = req("big", 95, output=10)
        e.scheduler.add(r)
        self.assertIn("--max-model-len", r.error)

    def test_a_request_that_can_never_fit_the_cache_fails_instead_of_preempting_itself(self):
        e = engine(blocks=4)
        fits, never = req("fits", 10, output=7), req("never", 10, output=8)   # 16 and 17 tokens of KV
        e.scheduler.add(fits)
        e.scheduler.add(never)
        self.assertIsNone(fits.error)
        self.assertIn("larger than the KV cache", never.error)


class StepAndClock(unittest.TestCase):
    def test_a_step_is_priced_with_the_kv_after_it(self):
        e = engine()
        put_running(e, req("a", 100), 100, generated=1)
        e.scheduler.add(req("b", 50))
        e.step()
        self.assertAlmostEqual(e.clock, main.step_seconds(H100, LLAMA, 51, 101 + 50))

    def test_chunked_prefill_spreads_a_long_prompt_over_steps(self):
        e = engine(max_num_batched_tokens=8)
        r = req("r", 20, output=3)
        e.scheduler.add(r)
        chunks = [tokens(e.step())["r"] for _ in range(3)]
        self.assertEqual(chunks, [8, 8, 4])
        self.assertEqual(r.generated, 1)
        self.assertEqual(r.first_token_s, e.clock)

    def test_tokens_are_timed_at_the_end_of_their_step_and_blocks_freed_then(self):
        e = engine(blocks=10)
        r = req("r", 3, output=1)
        e.scheduler.add(r)
        e.step()
        self.assertEqual(r.first_token_s, e.clock)
        self.assertEqual(r.last_token_s, e.clock)
        self.assertEqual(e.stats.kv_peak, 1)                          # sampled before the release
        self.assertEqual(e.scheduler.pool.used_count(), 0)

    def test_closed_loop_sends_the_next_request_when_one_ends(self):
        e = engine()
        first, second = req(0, 4, output=2), req(1, 4, output=2)
        main.simulate(e, [first, second], concurrency=1)
        self.assertEqual(second.sent_s, first.last_token_s)
        self.assertEqual(second.queue_s, 0.0)

    def test_open_loop_idles_until_the_next_arrival(self):
        e = engine()
        late = req(0, 4, output=1, sent_s=5.0)
        main.simulate(e, [late])
        self.assertEqual(late.queue_s, 0.0)
        self.assertGreater(late.first_token_s, 5.0)


if __name__ == "__main__":
    unittest.main()
