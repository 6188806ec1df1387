"""Write the tiny files `Outrider --self-test --fixtures DIR` exercises the product with.

    .venv/bin/python packaging/self_test_fixtures.py DIR
    QT_QPA_PLATFORM=offscreen dist/Outrider/Outrider --self-test --model M.gguf --fixtures DIR

Runs from the checkout, not from the bundle: the models are written by the test suite's
random-weight GGUF writers (tests/fixtures/tiny_gguf.py, tiny_vision_gguf.py), which need
`gguf` and numpy from the venv. The names are app/self_test/fixtures.py's; what each is for is
said there. About 10 MB in all, written in a second or two; files already there are written
again (they are cheap, and a stale one would test nothing).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: the checkout's packages, not an install
    sys.path.insert(0, str(ROOT))

from app.self_test import fixtures as names  # noqa: E402  (after the path is set)
from tests.fixtures.tiny_gguf import DRAFT, TARGET, write_tiny_gguf  # noqa: E402
from tests.fixtures.tiny_vision_gguf import PROJECTOR, tiny_png, write_tiny_mmproj  # noqa: E402

# Qwen 2.5's chat template, cut to what the tool check renders: ChatML with the tools in the
# system turn and calls as <tool_call>{json}</tool_call> (Outrider's "hermes" family, whose
# calls it renders, parses and forces with a grammar).
HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "{%- if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}{%- else %}"
    "You are a helpful assistant.{%- endif %}\n\n# Tools\n\nYou may call one or more "
    "functions to assist with the user query.\n\n<tools>"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
    "{%- elif messages[0]['role'] == 'system' %}"
    "<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>\n"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) "
    "or (message.role == 'assistant' and not message.tool_calls) %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{%- elif message.role == 'assistant' %}<|im_start|>assistant"
    "{%- if message.content %}\n{{ message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "\n<tool_call>\n{\"name\": \"{{ tool_call.name }}\", \"arguments\": "
    "{{ tool_call.arguments | tojson }}}\n</tool_call>"
    "{%- endfor %}<|im_end|>\n"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user"
    "{%- endif %}\n<tool_response>\n{{ message.content }}\n</tool_response>"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)

TOOLS_SPEC = replace(TARGET, name="tiny-tools", seed=31, chat_template=HERMES_TEMPLATE)
QUANTIZE_SPEC = replace(DRAFT, name="tiny-quantize", seed=32)  # 64 wide: Q8_0's 32-blocks fit


def write_fixtures(folder: Path) -> list[Path]:
    """Write every fixture into `folder` (made if missing); the paths written."""
    folder.mkdir(parents=True, exist_ok=True)
    written = [
        write_tiny_gguf(folder / names.TOOLS_MODEL, TOOLS_SPEC),
        write_tiny_gguf(folder / names.VISION_MODEL, TARGET),
        write_tiny_mmproj(folder / names.VISION_PROJECTOR, PROJECTOR),
        write_tiny_gguf(folder / names.QUANTIZE_SOURCE, QUANTIZE_SPEC),
    ]
    image = folder / names.IMAGE
    image.write_bytes(tiny_png(48, 40, seed=5))
    written.append(image)
    return written


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0].startswith("-"):
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        print("usage: self_test_fixtures.py DIR", file=sys.stderr)
        return 2
    for path in write_fixtures(Path(argv[0]).expanduser().resolve()):
        print(f"{path} ({path.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
