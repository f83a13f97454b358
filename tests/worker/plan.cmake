# The executors' shared arithmetic (worker/runtime/plan.h) as a table of responses.
kolo_test(plan worker "unit;worker" test_plan.c)
target_link_libraries(${KOLO_LAST_TEST_TARGET} PRIVATE kolo_worker)

# One rank's part in a job that spans hosts (worker/coll/hier_plan.h): lanes,
# links and the allreduce's algorithm, as tables.
kolo_test(hier_plan worker "unit;worker" test_hier_plan.c)
target_link_libraries(${KOLO_LAST_TEST_TARGET} PRIVATE kolo_worker)

# Where a rank's time goes (worker/runtime/time_split.h): the four-state
# clock as a table of changes.
kolo_test(time_split worker "unit;worker" test_time_split.c)
target_link_libraries(${KOLO_LAST_TEST_TARGET} PRIVATE kolo_worker)

# The host segment an elastic rank keeps for its next generation
# (worker/runtime/keep.h): the hosts' choice as a table, the parked list.
kolo_test(keep worker "unit;worker" test_keep.c)
target_link_libraries(${KOLO_LAST_TEST_TARGET} PRIVATE kolo_worker)
