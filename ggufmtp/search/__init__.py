"""Search the recipe (issue #43): measure each tensor group's sensitivity, allocate types under a budget, prove the result."""
