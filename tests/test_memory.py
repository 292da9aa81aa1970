"""A replaced model's memory goes back to the system (engine.memory.release_freed,
which the TUI calls when a new model has loaded)."""
import json
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import json, psutil
    from rapidmoe.engine.generate import ChatSession
    from rapidmoe.engine.memory import release_freed
    from rapidmoe.engine.loader import load_model
    from rapidmoe.engine.sampling import SamplingParams

    rss = lambda: psutil.Process().memory_info().rss
    after = []
    for _ in range(3):
        m = load_model("demo", critical="auto")
        list(ChatSession(m, params=SamplingParams(max_tokens=6, seed=1)).send("hi"))
        m = None  # the model and its chat let go
        release_freed()
        after.append(rss())
    print(json.dumps(after))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="malloc_trim is glibc's")
def test_reloading_the_demo_does_not_grow_the_process():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True, timeout=600)
    after = json.loads(out.stdout.strip().splitlines()[-1])
    growth = max(after[1:]) - after[0]
    # without the trim, freed heap pages stayed in glibc's arenas: +40 to +130 MiB per reload
    assert growth < 24 * 2**20, [round(a / 2**20) for a in after]
