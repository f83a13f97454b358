# The shared-memory collectives (worker/coll/shmcoll.c): ranks as processes and
# as threads, every dtype and op, failures.
kolo_test(shmcoll worker "unit;worker" test_shmcoll.c)
target_link_libraries(${KOLO_LAST_TEST_TARGET} PRIVATE kolo_worker)
