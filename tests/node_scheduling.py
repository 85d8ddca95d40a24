"""xdist scheduling that keeps the tests of the real node and of the control planes on one worker.

pytest-xdist's own way (``--dist loadgroup`` with ``xdist_group`` marks) does not group with
pytest 9 (xdist 3.8 renames the collected items through an attribute pytest 9 no longer reads),
and it would also group every other test by module. This is xdist's ``load`` scheduling (a free
worker takes the next test) with one rule: the *cluster tests* all go to one worker, the first
to ask while any are pending, before its other tests; the other workers never get one, and each
stops once only those are left. The cluster tests are, in this order:

- the tests in ``test_real_node*.py`` files, one after another (its node starts once and stops
  after them: two real nodes on one host would share a bridge, ports and containerd's state);
- the tests of files that use a control plane (:func:`uses_a_plane`): each plane is then
  started once in the session instead of once per worker (a whole plane is ~90 s of CPU for its
  API server, etcd and controllers; CI runs on 2 cores).

The scheduler sees test ids only, so a file is a plane file when one of its functions (a test or
a fixture) takes a plane fixture; ``tests/conftest.py`` checks every collected test against the
fixtures it really uses, so a test that reaches a plane some other way fails collection.

One more rule, for every other file: a file that defines a module-scoped fixture
(:func:`has_a_module_fixture`: a Ray head, a Prometheus-scraped training, a compiled pipeline)
is *claimed* by the first worker to take one of its tests, and only that worker takes the rest.
``load`` scheduling alone hands a file's tests out in turn, so each worker set the fixture up.
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
def functions_of(path: Path) -> tuple[ast.FunctionDef | ast.AsyncFunctionDef, ...]:
    """Every function the test file ``path`` defines (none when it cannot be read or parsed)."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError):
        return ()
    return tuple(
        node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    )


@functools.cache
def uses_a_plane(path: Path) -> bool:
    """Whether a function of the test file ``path`` takes one of :data:`PLANE_FIXTURES`."""
    return any(
        argument.arg in PLANE_FIXTURES
        for function in functions_of(path)
        for argument in (*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs)
    )


@functools.cache
def has_a_module_fixture(path: Path) -> bool:
    """Whether the test file ``path`` defines a fixture with ``scope="module"``."""
    return any(
        isinstance(decorator, ast.Call)
        and any(
            keyword.arg == "scope"
            and isinstance(keyword.value, ast.Constant)
            and keyword.value.value == "module"
            for keyword in decorator.keywords
        )
        for function in functions_of(path)
        for decorator in function.decorator_list
    )


class ClusterOwnerScheduling(LoadScheduling):
    """``load`` scheduling; the real node's and the control planes' tests on one worker."""

    owner = None
    """The worker that runs the cluster tests: the first to ask while any are pending."""

    def __init__(self, config, log=None):
        super().__init__(config, log)
        self.claims: dict[str, object] = {}
        """A file with a module-scoped fixture → the worker that took its first test."""
        self._files: list[str] = []
        self._ranks: list[int | None] = []
        """Each collected test's file and rank, found once (:meth:`_known`): a worker asks for
        its next test ~1,900 times, and finding them for every pending test on each ask took
        the controller ~11 s of CPU."""

    def _known(self) -> None:
        if len(self._files) != len(self.collection):
            root = Path(self.config.rootpath)
            self._files = [file_of(nodeid) for nodeid in self.collection]
            self._ranks = [
                0 if is_node_test(nodeid) else 1 if uses_a_plane(root / file) else None
                for nodeid, file in zip(self.collection, self._files, strict=True)
            ]

    def _rank(self, index: int) -> int | None:
        """0: a real node's test, 1: a plane file's, None: any worker's."""
        self._known()
        return self._ranks[index]

    def _claimed_by_another(self, node, index: int) -> bool:
        self._known()
        claimant = self.claims.get(self._files[index], node)
        return claimant is not node

    def _claim(self, node, chosen: list[int]) -> None:
        self._known()
        for index in chosen:
            file = self._files[index]
            if has_a_module_fixture(Path(self.config.rootpath) / file):
                self.claims.setdefault(file, node)

    def _send_tests(self, node, num: int) -> None:
        ranks = {i: self._rank(i) for i in self.pending}
        if self.owner is None and any(rank is not None for rank in ranks.values()):
            self.owner = node  # the first worker to ask while cluster tests are pending
        others = [
            i for i in self.pending if ranks[i] is None and not self._claimed_by_another(node, i)
        ]
        if node is self.owner:
            pinned = {i: rank for i, rank in ranks.items() if rank is not None}
            candidates = sorted(pinned, key=pinned.__getitem__) + others  # stable: in order
        else:
            candidates = others
        chosen = candidates[:num]
        if chosen:
            self._claim(node, chosen)
            taken = set(chosen)
            self.pending[:] = [i for i in self.pending if i not in taken]
            self.node2pending[node].extend(chosen)
            node.send_runtest_some(chosen)

    def _nothing_left_for(self, node) -> bool:
        """Whether every pending test is another worker's: the owner's, or in another's claim."""
        return all(
            (self._rank(i) is not None and self.owner not in (None, node))
            or self._claimed_by_another(node, i)
            for i in self.pending
        )

    def check_schedule(self, node, duration: float = 0) -> None:
        if (
            self.pending
            and not self.node2pending[node]
            and not node.shutting_down
            and self._nothing_left_for(node)
        ):
            node.shutdown()  # what is left, other workers take: nothing for this one
            return
        super().check_schedule(node, duration)

    def remove_node(self, node):
        """A worker that crashed: its claims and the cluster tests go to whoever asks next."""
        self.claims = {file: n for file, n in self.claims.items() if n is not node}
        if node is self.owner:
            self.owner = None
        return super().remove_node(node)
