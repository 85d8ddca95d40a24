"""xdist scheduling that keeps the real node's tests on one worker (one node per session).

pytest-xdist's own way (``--dist loadgroup`` with ``xdist_group`` marks) does not group with
pytest 9 (xdist 3.8 renames the collected items through an attribute pytest 9 no longer reads),
and it would also group every other test by module. This is xdist's ``load`` scheduling (a free
worker takes the next test) with one rule: the tests in ``test_real_node*.py`` files all go to
one worker, the first to ask, before its other tests and one after another (so its node starts
once and stops after them); the other worker never gets one, and stops once only those are
left.
"""

from __future__ import annotations

import functools

from xdist.scheduler import LoadScheduling

NODE_TEST_FILES = "test_real_node"
"""Files of tests that run pods on the real node (tests/cluster/node.py) start with this."""


@functools.cache
def is_node_test(nodeid: str) -> bool:
    return nodeid.split("::", 1)[0].rsplit("/", 1)[-1].startswith(NODE_TEST_FILES)


class OneNodeWorkerScheduling(LoadScheduling):
    """``load`` scheduling; the real node's tests all on one worker."""

    node_owner = None

    def _send_tests(self, node, num: int) -> None:
        if self.node_owner is None and any(is_node_test(self.collection[i]) for i in self.pending):
            self.node_owner = node  # the first worker to ask while node tests are pending
        node_tests = [i for i in self.pending if is_node_test(self.collection[i])]
        others = [i for i in self.pending if not is_node_test(self.collection[i])]
        # The owner takes the node's tests first, one after another (the node then stops,
        # tests/cluster/node_plugin.py); no other worker takes any.
        candidates = node_tests + others if node is self.node_owner else others
        chosen = candidates[:num]
        if chosen:
            taken = set(chosen)
            self.pending[:] = [i for i in self.pending if i not in taken]
            self.node2pending[node].extend(chosen)
            node.send_runtest_some(chosen)

    def check_schedule(self, node, duration: float = 0) -> None:
        left_for_others = [i for i in self.pending if not is_node_test(self.collection[i])]
        if (
            self.pending
            and not left_for_others
            and node is not self.node_owner
            and self.node_owner is not None
            and not self.node2pending[node]
            and not node.shutting_down
        ):
            node.shutdown()  # only the node's tests are left: nothing for this worker
            return
        super().check_schedule(node, duration)
