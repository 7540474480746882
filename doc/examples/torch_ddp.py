import torch, torch.distributed as dist
import tfab.torch  # registers the backend "tfab"

dist.init_process_group("tfab")  # torchrun's RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
model(torch.randn(4, 8) * (dist.get_rank() + 1)).sum().backward()  # averaged over the ranks
print(f"rank {dist.get_rank()}: gradient sum {model.module.weight.grad.sum().item():.6f}")
