# Snapshots through libkolo: in-process coordinator, ranks as threads.
kolo_test(snapshot worker "unit;worker" test_snapshot.c)
target_link_libraries(${KOLO_LAST_TEST_TARGET} PRIVATE kolo_worker kolo_coord)

# The worker program of tests/integration/test_snapshots.sh (libkolo.so,
# plus common's SHA-256 for the acknowledgement log).
add_executable(kolo-test-snap-writer snap_writer.c)
target_link_libraries(kolo-test-snap-writer PRIVATE kolo_shared kolo_common)
