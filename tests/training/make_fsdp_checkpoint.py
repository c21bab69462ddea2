"""Write a real verl FSDP checkpoint of a Hugging Face model on CPU (gloo), for the tests.

Run under torchrun (one process per rank): each rank wraps the model with FSDP2 ``fully_shard``
and saves through verl's own ``FSDPCheckpointManager``, so the shards, ``fsdp_config.json`` and
``huggingface/`` directory are exactly what a GPU training run writes for its actor.

    python -m torch.distributed.run --standalone --nproc_per_node 2 make_fsdp_checkpoint.py MODEL_DIR OUT_DIR
"""

import os
import sys

import torch
import torch.distributed as dist


def main(model_dir: str, out_dir: str) -> None:
    dist.init_process_group("gloo")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("fsdp",))
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    manager = FSDPCheckpointManager(
        model,
        optimizer,
        None,
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        checkpoint_config={"save_contents": ["model", "optimizer", "extra"]},
    )
    manager.save_checkpoint(out_dir, global_step=int(os.environ.get("CKPT_STEP", "1")))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
