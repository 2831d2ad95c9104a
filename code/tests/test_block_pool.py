import unittest

from helpers import main


class BlockPoolTests(unittest.TestCase):
    def setUp(self):
        self.pool = main.BlockPool(4)

    def test_allocates_least_recently_used_first(self):
        a = self.pool.allocate(2)
        self.assertEqual(a, [0, 1])
        self.pool.release([1])
        self.pool.release([0])
        # 2 and 3 were never used, then 1, then 0 came back in that order.
        self.assertEqual(self.pool.allocate(4), [2, 3, 1, 0])

    def test_release_walks_blocks_in_reverse_so_the_tail_is_evicted_first(self):
        blocks = self.pool.allocate(4)
        self.pool.release(blocks)
        self.assertEqual(list(self.pool.free), [3, 2, 1, 0])

    def test_a_released_block_keeps_its_key_and_is_still_a_hit(self):
        [block] = self.pool.allocate(1)
        self.pool.register(block, ("system", 0))
        self.pool.release([block])
        self.assertEqual(self.pool.lookup([("system", 0)]), [block])
        self.assertEqual(self.pool.evictions, 0)

    def test_reusing_a_keyed_block_counts_an_eviction_and_forgets_the_key(self):
        [block] = self.pool.allocate(1)
        self.pool.register(block, ("system", 0))
        self.pool.release([block])
        self.pool.allocate(4)
        self.assertEqual(self.pool.evictions, 1)
        self.assertEqual(self.pool.lookup([("system", 0)]), [])

    def test_lookup_returns_only_the_leading_run(self):
        blocks = self.pool.allocate(3)
        self.pool.register(blocks[0], "a")
        self.pool.register(blocks[2], "c")
        self.assertEqual(self.pool.lookup(["a", "b", "c"]), [blocks[0]])

    def test_touch_takes_idle_hits_off_the_free_list_and_counts_references(self):
        [block] = self.pool.allocate(1)
        self.pool.register(block, "a")
        self.pool.release([block])
        self.assertEqual(self.pool.free_among([block]), 1)
        self.pool.touch([block])
        self.pool.touch([block])
        self.assertEqual(self.pool.free_count(), 3)
        self.assertEqual(self.pool.free_among([block]), 0)
        self.pool.release([block])
        self.assertEqual(self.pool.free_count(), 3)   # one reference left
        self.pool.release([block])
        self.assertEqual(self.pool.free_count(), 4)

    def test_allocating_more_than_free_is_a_capacity_error(self):
        self.pool.allocate(3)
        with self.assertRaises(main.CapacityError):
            self.pool.allocate(2)

    def test_duplicate_content_stays_unkeyed(self):
        a, b = self.pool.allocate(2)
        self.pool.register(a, "x")
        self.pool.register(b, "x")
        self.assertEqual(self.pool.cached, {"x": a})
        self.assertNotIn(b, self.pool.key_of)


if __name__ == "__main__":
    unittest.main()
