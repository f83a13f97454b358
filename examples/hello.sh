#!/bin/sh
# The smallest kolo job: every worker reports who it is, works for a few
# "epochs" and exits. Run it with: kolo run -np 4 -- sh examples/hello.sh
echo "rank $KOLO_RANK of $KOLO_SIZE (local $KOLO_LOCAL_RANK of $KOLO_LOCAL_SIZE, cross $KOLO_CROSS_RANK of $KOLO_CROSS_SIZE) on $HOROVOD_HOSTNAME, pid $$, job $KOLO_JOB"
for epoch in 1 2 3; do
  sleep 0.2
  echo "rank $KOLO_RANK: epoch $epoch done"
done
