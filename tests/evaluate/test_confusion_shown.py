"""The confusion matrix the KFP UI gets: whole up to 50 classes, above that the classes with the
most mistakes and one "other" class, every row and column still summing to the full matrix's."""

from __future__ import annotations

import random

from components.evaluate.confusion import SHOWN_CLASSES, most_confused, shown_confusion


def random_confusion(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [
        [rng.choice((0, 0, 0, 1, 2)) + (20 if i == j else 0) for j in range(n)] for i in range(n)
    ]


def test_up_to_the_limit_the_matrix_is_whole():
    names = [f"c{i}" for i in range(SHOWN_CLASSES)]
    matrix = random_confusion(SHOWN_CLASSES)
    shown = shown_confusion(names, matrix)
    assert (shown.class_names, shown.counts, shown.merged) == (names, matrix, 0)


def test_above_the_limit_the_most_confused_classes_stay_and_every_sum_is_kept():
    n = 12
    names = [f"c{i}" for i in range(n)]
    matrix = [[10 if i == j else 0 for j in range(n)] for i in range(n)]
    matrix[7][2] = 5  # c7 mistaken for c2: 5 mistakes of c7's, 5 of c2's
    matrix[9][4] = 1
    matrix[11][7] = 2  # c7 now has 7, c11 2

    # mistakes: c7 7, c2 5, c11 2, then c4 and c9 1 each (a tie: the first in the model's order)
    assert most_confused(matrix, 4) == [2, 4, 7, 11]
    shown = shown_confusion(names, matrix, limit=6)
    assert shown.class_names == ["c2", "c4", "c7", "c9", "c11", "(other 7 classes)"]
    assert shown.merged == 7
    assert shown.counts == [
        [10, 0, 0, 0, 0, 0],
        [0, 10, 0, 0, 0, 0],
        [5, 0, 10, 0, 0, 0],
        [0, 1, 0, 10, 0, 0],
        [0, 0, 2, 0, 10, 0],
        [0, 0, 0, 0, 0, 70],  # the 7 others' own images
    ]
    merged = shown_confusion(names, matrix, limit=3)  # c2 and c7 kept
    # the 10 others: their own 100 images and c9 taken for c4, a mistake within "other"
    assert merged.counts == [[10, 0, 0], [5, 10, 0], [0, 2, 101]]


def test_a_thousand_classes_shrink_to_the_limit_with_the_same_sums():
    n = 1000
    names = [f"n{i:08d}" for i in range(n)]
    matrix = random_confusion(n, seed=3)
    shown = shown_confusion(names, matrix)
    kept = most_confused(matrix, SHOWN_CLASSES - 1)

    assert len(shown.class_names) == SHOWN_CLASSES and shown.merged == n - SHOWN_CLASSES + 1
    assert all(len(row) == SHOWN_CLASSES for row in shown.counts)
    assert sum(map(sum, shown.counts)) == sum(map(sum, matrix))
    for position, index in enumerate(kept):
        assert shown.class_names[position] == names[index]
        assert sum(shown.counts[position]) == sum(matrix[index])  # its images
        assert sum(row[position] for row in shown.counts) == sum(row[index] for row in matrix)
        assert shown.counts[position][position] == matrix[index][index]


def test_the_other_class_is_never_named_like_a_real_one():
    names = ["(other 2 classes)", "b", "c"]
    matrix = [[1, 1, 1], [1, 1, 1], [1, 1, 1]]
    assert shown_confusion(names, matrix, limit=2).class_names[-1] == "((other 2 classes))"
