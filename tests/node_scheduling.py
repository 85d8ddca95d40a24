"""xdist scheduling that keeps the tests of the real node and of the control planes on one worker.

pytest-xdist's own way (``--dist loadgroup`` with ``xdist_group`` marks) does not group with
pytest 9 (xdist 3.8 renames the collected items through an attribute pytest 9 no longer reads),
and it would also group every other test by module. This is xdist's ``load`` scheduling (a free
worker takes the next test) with one rule: the *cluster tests* all go to one worker, the first
to ask while any are pending, before its other tests; the other worker never gets one, and stops
once only those are left. The cluster tests are, in this order:

- the tests in ``test_real_node*.py`` files, one after another (its node starts once and stops
  after them: two real nodes on one host would share a bridge, ports and containerd's state);
- the tests of files that use a control plane (:func:`uses_a_plane`): each plane is then
  started once in the session instead of once per worker (a whole plane is ~90 s of CPU for its
  API server, etcd and controllers; CI runs on 2 cores).

The scheduler sees test ids only, so a file is a plane file when one of its functions (a test or
a fixture) takes a plane fixture; ``tests/conftest.py`` checks every collected test against the
fixtures it really uses, so a test that reaches a plane some other way fails collection.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from xdist.scheduler import LoadScheduling

NODE_TEST_FILES = "test_real_node"
"""Files of tests that run pods on the real node (tests/cluster/node.py) start with this."""
PLANE_FIXTURES = frozenset({"clusters", "cluster", "k8s", "operator_k8s", "bare_k8s"})
"""The fixtures of tests/cluster/plugin.py that start a control plane."""


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


@functools.cache
def is_node_test(nodeid: str) -> bool:
    return file_of(nodeid).rsplit("/", 1)[-1].startswith(NODE_TEST_FILES)


@functools.cache
def uses_a_plane(path: Path) -> bool:
    """Whether a function of the test file ``path`` takes one of :data:`PLANE_FIXTURES`."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError):
        return False
    return any(
        argument.arg in PLANE_FIXTURES
        for function in ast.walk(tree)
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef)
        for argument in (*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs)
    )


class ClusterOwnerScheduling(LoadScheduling):
    """``load`` scheduling; the real node's and the control planes' tests on one worker."""

    owner = None

    def _rank(self, index: int) -> int | None:
        """0: a real node's test, 1: a plane file's, None: any worker's."""
        nodeid = self.collection[index]
        if is_node_test(nodeid):
            return 0
        if uses_a_plane(Path(self.config.rootpath) / file_of(nodeid)):
            return 1
        return None

    def _send_tests(self, node, num: int) -> None:
        ranks = {i: self._rank(i) for i in self.pending}
        if self.owner is None and any(rank is not None for rank in ranks.values()):
            self.owner = node  # the first worker to ask while cluster tests are pending
        others = [i for i in self.pending if ranks[i] is None]
        if node is self.owner:
            pinned = {i: rank for i, rank in ranks.items() if rank is not None}
            candidates = sorted(pinned, key=pinned.__getitem__) + others  # stable: in order
        else:
            candidates = others
        chosen = candidates[:num]
        if chosen:
            taken = set(chosen)
            self.pending[:] = [i for i in self.pending if i not in taken]
            self.node2pending[node].extend(chosen)
            node.send_runtest_some(chosen)

    def check_schedule(self, node, duration: float = 0) -> None:
        left_for_others = [i for i in self.pending if self._rank(i) is None]
        if (
            self.pending
            and not left_for_others
            and node is not self.owner
            and self.owner is not None
            and not self.node2pending[node]
            and not node.shutting_down
        ):
            node.shutdown()  # only the owner's tests are left: nothing for this worker
            return
        super().check_schedule(node, duration)
