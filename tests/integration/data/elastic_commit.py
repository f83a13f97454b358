"""An elastic training that commits a state of a few MB every 10 steps and
logs every acknowledged snapshot as "acked ID SHA256 BYTES" (rank 0), for
the coordinator kill test. Every rank trains on the same batch per step."""
import os
import sys
import time

import torch

import kolo
import kolo.torch as hvd

os.environ["KOLO_COMMIT_VERIFY"] = "1"
hvd.init()
steps = int(sys.argv[1])
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 64))
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                               named_parameters=model.named_parameters())
state = hvd.elastic.TorchState(model=model, optimizer=opt, step=0)
seen = [0]


def log_acks():
    st = state.durable_status()
    if st["acked_id"] and st["acked_id"] != seen[0]:
        seen[0] = st["acked_id"]
        print("acked %d %s %d" % (st["acked_id"], st["acked_sha256"], st["acked_bytes"]), flush=True)


@hvd.elastic.run
def train(state):
    while state.step < steps:
        g = torch.Generator()
        g.manual_seed(state.step)
        x = torch.randn(16, 256, generator=g)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        state.step += 1
        if state.step % 10 == 0:
            state.commit()
            print("STEP %d gen %d t %.3f" % (state.step, kolo._eng().generation(), time.time()),
                  flush=True)
        if hvd.rank() == 0:
            log_acks()
        time.sleep(0.01)


train(state)
if hvd.rank() == 0:
    state.flush(60)
    log_acks()
print("FINAL %d" % state.step, flush=True)
