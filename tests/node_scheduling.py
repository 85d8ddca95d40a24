"""xdist scheduling that keeps the real node's tests on one worker (one node per session).

pytest-xdist's own way (``--dist loadgroup`` with ``xdist_group`` marks) does not group with
pytest 9 (xdist 3.8 renames the collected items through an attribute pytest 9 no longer reads),
and it would also group every other test by module. This is xdist's ``load`` scheduling (a free
worker takes the next test) with one rule: the tests in ``test_real_node*.py`` files all go to
the worker that took the first of them; the other worker never gets one, and stops once only
those are left.
"""

from __future__ import annotations

from xdist.scheduler import LoadScheduling

NODE_TEST_FILES = "test_real_node"
"""Files of tests that run pods on the real node (tests/cluster/node.py) start with this."""


def is_node_test(nodeid: str) -> bool:
    return nodeid.split("::", 1)[0].rsplit("/", 1)[-1].startswith(NODE_TEST_FILES)


class OneNodeWorkerScheduling(LoadScheduling):
    """``load`` scheduling; the real node's tests all on one worker."""

    node_owner = None

    def _send_tests(self, node, num: int) -> None:
        chosen, position = [], 0
        while len(chosen) < num and position < len(self.pending):
            index = self.pending[position]
            if is_node_test(self.collection[index]):
                if self.node_owner is None:
                    self.node_owner = node
                if node is not self.node_owner:
                    position += 1
                    continue
            chosen.append(index)
            del self.pending[position]
        if chosen:
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
