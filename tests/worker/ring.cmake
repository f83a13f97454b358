# The ring backend: ranks as threads over real tcp and shm connections.
kolo_test(ring worker "unit;worker" test_ring.c)
target_link_libraries(${KOLO_LAST_TEST_TARGET} PRIVATE kolo_worker)
