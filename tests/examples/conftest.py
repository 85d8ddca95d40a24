"""What every example's test gets."""

from tests.local_nodes import local_nodes_in_the_tests_folder

__all__ = ["local_nodes_in_the_tests_folder"]  # autouse: each test's local nodes in its folder
