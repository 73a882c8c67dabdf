"""Is vanilla llama-server deterministic under GGML_CUDA_GRAPH_OPT=1? The same chat request three
times, and twice the /completion reproduction that verify's numerics analysis makes, with the option
off and on (`bash benchmarks/gpu/run_h200.sh gopt-determinism`).

    python3 benchmarks/gpu/gopt_determinism.py MODEL.gguf SUITE.jsonl OUT.json
"""

import json
import sys

from ggufmtp.measure.core.suite import load_suite
from ggufmtp.runtime.server import LlamaServer, ServerConfig

model, suite_path, out = sys.argv[1], sys.argv[2], sys.argv[3]
suite = load_suite(suite_path)
res = {}
for gopt in (False, True):
    env = {"GGML_CUDA_GRAPH_OPT": "1"} if gopt else {}
    cfg = ServerConfig(model=model, gpu_layers=999, ctx_size=4096, parallel=1, metrics=True, env=env)
    rows = []
    with LlamaServer(cfg) as s:
        for p in suite.prompts[:6]:
            body = {"messages": p.chat_messages(), "temperature": 0.0, "max_tokens": 128, "seed": 42, "cache_prompt": False}
            chats = [s.post_json("/v1/chat/completions", body)["choices"][0]["message"]["content"] for _ in range(3)]
            t = s.post_json("/apply-template", {"messages": p.chat_messages()})["prompt"]
            ids = s.tokenize(t, add_special=True, parse_special=True)
            comp = [s.complete(ids, n_predict=128, temperature=0.0, seed=42, cache_prompt=False, n_probs=2)["content"] for _ in range(2)]
            rows.append({"prompt": p.id, "chat_same_3x": len(set(chats)) == 1, "completion_same_2x": len(set(comp)) == 1,
                         "completion_reproduces_chat": comp[0].strip() == chats[0].strip(),
                         "chat_lens": [len(c) for c in chats], "completion_lens": [len(c) for c in comp]})
            print(("gopt=on " if gopt else "gopt=off"), rows[-1], flush=True)
    res["on" if gopt else "off"] = rows
json.dump(res, open(out, "w"), indent=1)
