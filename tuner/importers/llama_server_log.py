"""llama-server logs (plain files, or `journalctl -u <unit>` output) turned into a trace.

A task's arrival is when the server launched it on a slot (the log has no earlier trace of a request
that waited for a free slot), its prompt and output lengths come from the final timings and the
release line. The server's prompt cache tells how a prompt began: a task that reused at least the whole
prompt of the previous task on its slot is that conversation's next turn (the reused tokens are its
history, the gap since that task ended its think time); a shorter reuse is a shared prefix, such as a
system prompt, named by its length.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from tuner.catalog import IMPORTER_FORMATS
from tuner.config import StrictModel
from tuner.engines.llama_server_log import parse_llama_server_log
from tuner.errors import WorkloadError
from tuner.importers.base import IMPORTERS, imported_trace, read_lines
from tuner.models import TaskTimeline
from tuner.workloads import PrefixBlock, PromptShape, Trace, TraceRequest

__all__ = ["LlamaServerLogImporter", "LlamaServerLogOptions"]


class LlamaServerLogOptions(StrictModel):
    tag: str = Field(default="chat", description="Tag given to every request.")


@IMPORTERS.register("llama-server-log")
class LlamaServerLogImporter:
    description = IMPORTER_FORMATS["llama-server-log"]
    options_model = LlamaServerLogOptions

    def read(self, path: Path, options: LlamaServerLogOptions, *, name: str) -> Trace:
        tasks = parse_llama_server_log(read_lines(path))
        complete = [t for t in tasks if t.launch_s is not None and t.prompt_tokens is not None and t.eval_n]
        if tasks and not any(t.launch_s is not None for t in tasks):
            raise WorkloadError(
                f"{path}: the log has no timestamps; keep llama-server's default --log-timestamps, or import "
                "journalctl output, whose lines carry the time"
            )
        start = min((t.launch_s for t in complete if t.launch_s is not None), default=0.0)
        previous_on_slot: dict[int, tuple[TaskTimeline, TraceRequest]] = {}
        sessions = 0
        requests = []
        for task in complete:
            assert task.launch_s is not None and task.prompt_tokens is not None and task.eval_n is not None
            cached = max(0, task.prompt_tokens - (task.prompt_n or 0))
            earlier = previous_on_slot.get(task.slot)
            continues = (
                earlier is not None and earlier[0].prompt_tokens is not None and cached >= earlier[0].prompt_tokens
            )
            if continues and earlier is not None:
                previous, previous_request = earlier
                session, turn = previous_request.session, previous_request.turn + 1
                end = previous.release_s if previous.release_s is not None else task.launch_s
                prompt = PromptShape(history_tokens=cached, new_tokens=task.prompt_tokens - cached)
                think = max(0.0, task.launch_s - end)
            else:
                sessions += 1
                session, turn, think = f"s{sessions}", 0, 0.0
                blocks = [PrefixBlock(block=f"cached-{cached}", tokens=cached)] if cached else []
                prompt = PromptShape(shared_prefix=blocks, new_tokens=task.prompt_tokens - cached)
            if prompt.total_tokens == 0:
                prompt = PromptShape(new_tokens=1)
            request = TraceRequest(
                id=f"task-{task.task}",
                offset_s=round(task.launch_s - start, 6),
                session=session,
                turn=turn,
                think_s=round(think, 6),
                prompt=prompt,
                output_tokens=task.eval_n,
                tag=options.tag,
                duration_s=round(task.release_s - task.launch_s, 6) if task.release_s is not None else None,
            )
            requests.append(request)
            previous_on_slot[task.slot] = (task, request)
        return imported_trace(path, name, requests)
