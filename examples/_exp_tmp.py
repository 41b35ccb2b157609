import numpy as np, taichi as ti, tinn, swarm, sys
tinn.init(ti.cpu)
swarm.RADIUS = float(sys.argv[1]); swarm.OPTIMIZER["learning_rate"] = float(sys.argv[2]); swarm.W_COLLISION = float(sys.argv[3])
N = 1024
start, goal = swarm.ring(N, np.random.default_rng(0))
net = swarm.make_network(N, shared=False)
sim = swarm.Swarm(net, start, goal, 24)
tr = tinn.Trainer(net, tinn.create_optimizer(swarm.OPTIMIZER), tinn.create_loss({"otype": "L2"}))
r = swarm.train("array", sim, tr, 1000, float(sys.argv[4]), goal, report_every=20)
print(sys.argv[1:], r["objective"], r["distance"], r["collisions"], r["in_obstacles"])
