#!/usr/bin/env bash
# test_elastic_segments.sh with the torch worker (kolo.torch, hvd.elastic):
# an unchanged host keeps its shared segment across a reset, the host a
# spare joined makes a new one, and training ends where a fault-free run
# does. Skipped without torch.
SEGMENTS_WORKER=torch exec bash "$(dirname "$0")/test_elastic_segments.sh"
