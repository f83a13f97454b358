# Point-to-point transports (tcp, shm) and the blocking helpers.
kolo_test(transport worker "unit;worker" test_transport.c)
target_link_libraries(${KOLO_LAST_TEST_TARGET} PRIVATE kolo_worker)
# The authenticated mesh: strangers, floods, missing ranks, wrong keys.
kolo_test(mesh worker "unit;worker" test_mesh.c)
target_link_libraries(${KOLO_LAST_TEST_TARGET} PRIVATE kolo_worker)
# The encrypted data plane: an on-path relay reads and alters the wire.
kolo_test(seal worker "unit;worker" test_seal.c)
target_link_libraries(${KOLO_LAST_TEST_TARGET} PRIVATE kolo_worker)
