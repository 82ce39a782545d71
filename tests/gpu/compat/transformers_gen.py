"""Compatibility workload: a GPT-2 built from a small GPT2Config (2 layers, 128 wide, vocabulary
1000) with random weights (nothing downloaded), greedy generation of 20 tokens.

  transformers_gen.py       result: the generated token ids (exact)
"""

from __future__ import annotations

import os

import compat_common as C


def work(argv: list[str]) -> dict:
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    torch = C.torch_setup()
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000, n_positions=128,
                     bos_token_id=0, eos_token_id=999, pad_token_id=0)
    torch.manual_seed(C.SEED)
    model = GPT2LMHeadModel(cfg).cuda().eval()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 999, (2, 8), generator=g).cuda()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=20, min_new_tokens=20,
                             do_sample=False, num_beams=1, pad_token_id=0)
    torch.cuda.synchronize()
    new = out[:, ids.shape[1]:].tolist()
    return {"ok": all(len(r) == 20 for r in new), "result": new, "tol": 0,
            "transformers": transformers.__version__, **C.torch_info(torch)}


if __name__ == "__main__":
    C.main(work)
