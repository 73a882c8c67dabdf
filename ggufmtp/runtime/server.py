"""A managed ``llama-server`` process: start, wait until healthy, query, and always stop.

``LlamaServer(ServerConfig(model=..., draft_mtp=True))`` runs the real binary (found with
:func:`ggufmtp.runtime.find_binary`) on ``127.0.0.1`` and a free port, in its own process group, with
its output captured to a log file (``server.log_path``). Every command-line flag is checked
against the binary's ``--help`` before starting (flag names change upstream, e.g. ``--spec-type
draft-mtp``). ``--no-repack`` is passed unless ``repack=True``: the CPU AMX repack path crashes with
SIGSEGV on some VMs.

The process is stopped on every path -- normal exit, exception, KeyboardInterrupt, timeout -- with
SIGTERM then SIGKILL to the whole group; an ``atexit`` hook stops servers still running at
interpreter exit, and on Linux the child also gets ``PR_SET_PDEATHSIG`` so that it dies with the
process that started it even if Python is killed. HTTP uses only the standard library.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import RuntimeMissingError, ServerError
from ..gguf.model import has_mtp_head as gguf_has_mtp
from ..gguf.model import is_mtp_sidecar
from ..jsontypes import JsonObject
from ..runtime import build as runtime
from .process import HOST, StartupWatch, describe_exit, die_with_parent, owns_listening_port, port_in_use, stall_timeout_default
from .replies import Reply, SpecCounters, parse_prometheus, require_drafting

__all__ = ["ServerConfig", "LlamaServer", "build_command", "display_command", "flags_without", "pick_flags",
           "parse_prometheus", "gguf_has_mtp", "require_drafting", "binary_flags", "binary_help", "Reply", "SpecCounters"]

LOG_TAIL_LINES = 20


@dataclass
class ServerConfig:
    """How to run llama-server. ``None`` leaves llama-server's own default.

    ``model`` is a GGUF file (``--model``); or ``hf_repo`` (``OWNER/REPO[:TAG]``, ``-hf``): llama.cpp's
    own downloader picks the file for TAG (and, under ``--spec-type draft-mtp``, an ``mtp-`` sidecar)
    from the Hub that ``$MODEL_ENDPOINT`` names, into ``$LLAMA_CACHE`` (set them in ``env``); exactly one."""

    model: str | os.PathLike | None
    draft_mtp: bool = False
    draft_n_max: int | None = None
    draft_n_min: int | None = None
    draft_p_min: float | None = None
    draft_model: str | os.PathLike | None = None  # an MTP-only sidecar GGUF (--spec-draft-model)
    ctx_size: int | None = 4096
    threads: int | None = None
    gpu_layers: int | str | None = None
    parallel: int | None = 1
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    extra_args: list[str] = field(default_factory=list)
    metrics: bool = True
    repack: bool = False
    llama_cpp_bin: str | os.PathLike | None = None
    port: int | None = None  # None = a free port
    log_path: str | os.PathLike | None = None  # None = a fresh temp file
    startup_timeout: float = 180.0
    # a starting server whose log stops growing while it does not listen is hung (see StartupWatch)
    stall_timeout: float | None = field(default_factory=stall_timeout_default)
    request_timeout: float = 600.0
    check_mtp: bool = True  # refuse draft_mtp on a GGUF without an MTP block (llama-server would not draft)
    env: dict[str, str] | None = None
    hf_repo: str | None = None

    def __post_init__(self) -> None:
        if (self.model is None) == (self.hf_repo is None):
            raise ServerError("a llama-server serves one model: give either model (a GGUF file) or hf_repo (OWNER/REPO[:TAG])")

    @property
    def served(self) -> str:
        """The model as the command line names it (a path, or ``-hf OWNER/REPO[:TAG]``)."""
        return str(self.model) if self.model is not None else f"-hf {self.hf_repo}"


# ----------------------------------------------------------------------------- command lines
# build_command is the ONE place a llama-server command line is written; every other form (the
# display form of tune/profiles, the flag lists of a verify report) is derived from it.

SERVER_ONLY_FLAGS = ("--model", "-m", "--host", "--port")


def build_command(config: ServerConfig, binary: str | os.PathLike, port: int) -> list[str]:
    """The llama-server command line (argv) of ``config``, listening on ``HOST:port``."""
    c = config
    source = ["--model", str(c.model)] if c.model is not None else ["-hf", str(c.hf_repo)]
    args = [str(binary), *source, "--host", HOST, "--port", str(port)]
    args += _valued_flags((("--ctx-size", c.ctx_size), ("--threads", c.threads), ("--n-gpu-layers", c.gpu_layers),
                           ("--parallel", c.parallel), ("--cache-type-k", c.cache_type_k or None),
                           ("--cache-type-v", c.cache_type_v or None)))
    args += (["--metrics"] if c.metrics else []) + ([] if c.repack else ["--no-repack"])
    draft = (("--spec-draft-n-max", c.draft_n_max), ("--spec-draft-n-min", c.draft_n_min),
             ("--spec-draft-p-min", c.draft_p_min), ("--spec-draft-model", c.draft_model))
    if c.draft_mtp:
        args += ["--spec-type", "draft-mtp"] + _valued_flags(draft)
    elif any(v is not None for _, v in draft):
        raise ServerError("draft_n_max/draft_n_min/draft_p_min/draft_model need draft_mtp=True")
    args += [str(a) for a in c.extra_args]
    return args


def _valued_flags(pairs: Iterable[tuple[str, Any]]) -> list[str]:
    """``[flag, str(value), ...]`` for every pair whose value is set (not None)."""
    return [a for flag, v in pairs if v is not None for a in (flag, str(v))]


# flags whose value is a local file: recorded by the file's name (a local path never reaches a receipt)
PATH_FLAGS = ("--spec-draft-model", "-md", "--model-draft")


def flags_without(command: Sequence[str], drop: Iterable[str] = SERVER_ONLY_FLAGS) -> list[str]:
    """``command`` without its binary (``command[0]``) and without the flags in ``drop`` and their
    values (default: the model path and listening address, which differ from run to run); a draft
    model's path (:data:`PATH_FLAGS`) is kept as its file name."""
    dropped = set(drop)
    out: list[str] = []
    args = iter(command[1:])
    for a in args:
        if a in dropped:
            next(args, None)
            continue
        out.append(a)
        if a in PATH_FLAGS:
            value = next(args, None)
            if value is not None:
                out.append(Path(value).name)
    return out


def pick_flags(command: Sequence[str], names: Sequence[str]) -> list[str]:
    """The flags ``names`` of ``command`` with their values, in the order of ``names`` (those
    ``command`` does not have are left out)."""
    out: list[str] = []
    for name in names:
        if name in command:
            i = list(command).index(name)
            out += list(command[i:i + 2])
    return out


def display_command(config: ServerConfig, binary: str | os.PathLike | None = None,
                    binary_name: str | None = "llama-server") -> str:
    """The exact llama-server command line of ``config`` (as :class:`LlamaServer` would run it),
    without ``--host``/``--port``, after the environment assignments ``config.env`` adds, as one
    shell-quoted string; the binary named ``binary_name`` (None: the full path ``binary``)."""
    b = Path(binary) if binary is not None else Path("llama-server")
    args = flags_without(build_command(config, b, 0), ("--host", "--port"))
    env = [f"{k}={v}" for k, v in sorted((config.env or {}).items())]
    return shlex.join(env + [binary_name or str(b)] + args)


# ----------------------------------------------------------------------------- helpers

HELP_TIMEOUT_S = 10.0  # `llama-server --help` answers in well under a second
_help_cache: dict[tuple[str, int, int], str] = {}
_help_lock = threading.Lock()
_FLAG_RE = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")


def binary_flags(binary: Path) -> frozenset[str]:
    """Every flag spelled in ``binary --help`` (cached per binary path and mtime)."""
    return frozenset(_FLAG_RE.findall(binary_help(binary)))


def binary_help(binary: Path) -> str:
    """The text ``binary --help`` prints (cached per binary path, mtime and size); ServerError when
    it does not run or lists no ``--port`` (not a llama-server)."""
    st = binary.stat()
    key = (str(binary.resolve()), st.st_mtime_ns, st.st_size)
    with _help_lock:
        if key in _help_cache:
            return _help_cache[key]
    try:
        proc = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=HELP_TIMEOUT_S,
                              stdin=subprocess.DEVNULL, start_new_session=True)
    except subprocess.TimeoutExpired:
        raise ServerError(f"{binary}: `--help` did not finish within {HELP_TIMEOUT_S:.0f}s (a hung or wrong "
                          f"binary? point --llama-cpp-bin at a working llama-server)") from None
    except OSError as e:
        raise ServerError(f"{binary}: could not run `--help`: {e}") from e
    text = (proc.stdout or "") + (proc.stderr or "")
    if "--port" not in _FLAG_RE.findall(text):
        raise ServerError(f"{binary}: `--help` lists no --port; is this llama-server? Output: {text.strip()[:300]}")
    with _help_lock:
        _help_cache[key] = text
    return text


class _BindRace(Exception):
    pass


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


_live: weakref.WeakSet[LlamaServer] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for srv in list(_live):
        with contextlib.suppress(Exception):
            srv.stop()


# ----------------------------------------------------------------------------- the server


def _check_model_files(c: ServerConfig, model: Path) -> None:
    """Refuse, before starting, a model file llama-server would fail on (missing, an MTP-only
    sidecar as the main model, draft-mtp on a file without an MTP block)."""
    if not model.is_file():
        raise ServerError(f"model {model}: no such file")
    if is_mtp_sidecar(model):
        raise ServerError(
            f"model {model}: is an MTP-only sidecar (MTP block without the trunk); llama-server "
            f"crashes (SIGSEGV) on it as the main model -- pass it as draft_model next to its target")
    if c.draft_model is not None and not Path(c.draft_model).is_file():
        raise ServerError(f"draft model {c.draft_model}: no such file")
    mtp_file = Path(c.draft_model) if c.draft_model is not None else model
    if c.draft_mtp and c.check_mtp and gguf_has_mtp(mtp_file) is False:
        raise ServerError(
            f"model {mtp_file}: has no MTP block (no blk.<block_count-1>.nextn.eh_proj.weight), so "
            f"--spec-type draft-mtp cannot draft (llama-server would exit with 'failed to create MTP "
            f"context'); use a GGUF converted with MTP, or draft_mtp=False")


class LlamaServer:
    """A running llama-server. Use as a context manager, or call start()/stop()."""

    def __init__(self, config: ServerConfig):
        self.config = config
        self.binary: Path | None = None
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        self.log_path: Path | None = Path(config.log_path) if config.log_path else None
        self._temp_log = False
        self.command: list[str] = []
        self._log_fh = None
        self._props: dict | None = None

    # --- lifecycle
    def __enter__(self) -> LlamaServer:
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.stop()
        if exc_type is None:
            self.discard_log()

    def discard_log(self) -> None:
        """Delete the log if it is a temporary file this manager made (kept when a run failed,
        since error messages point at it)."""
        if self._temp_log and self.log_path is not None and self.proc is not None and self.proc.poll() is not None:
            with contextlib.suppress(OSError):
                self.log_path.unlink()

    def __del__(self):
        with contextlib.suppress(Exception):
            if self.proc is not None and self.proc.poll() is None:
                self.stop()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def build_command(self, binary: Path, port: int) -> list[str]:
        """The command line this server runs (see :func:`build_command`)."""
        return build_command(self.config, binary, port)

    def _check_flags(self, args: Iterable[str], binary: Path) -> None:
        known = binary_flags(binary)
        for a in args:
            if not a.startswith("-") or re.fullmatch(r"-\d+(\.\d+)?", a):
                continue
            flag = a.split("=", 1)[0]
            if flag not in known:
                raise ServerError(
                    f"{binary}: this llama-server has no `{flag}` flag (not in its --help); it may be an "
                    f"older or newer build than llama.cpp {runtime.LLAMA_CPP_COMMIT} that ggufmtp pins")

    def start(self) -> LlamaServer:
        if self.is_running():
            return self
        c = self.config
        try:
            self.binary = runtime.find_binary("llama-server", c.llama_cpp_bin)
        except RuntimeMissingError as e:
            raise ServerError(str(e)) from e
        if not self.binary.is_file():
            raise ServerError(f"llama-server: {self.binary} does not exist; run `ggufmtp runtime build`")
        if c.model is not None:  # with hf_repo the files are llama.cpp's to find
            _check_model_files(c, Path(c.model))
        if c.port is not None and port_in_use(c.port):
            raise ServerError(f"port {c.port} on {HOST} is already in use; pick another or let ggufmtp choose (port=None)")
        # a free port can be taken by someone else between our probe and llama-server's bind:
        # with an automatic port, retry on a bind failure
        attempts = 1 if c.port is not None else 3
        for attempt in range(attempts):
            try:
                self._launch(c.port if c.port is not None else _free_port())
                return self
            except _BindRace:
                if attempt == attempts - 1:
                    raise ServerError(f"llama-server could not bind a port on {HOST} after {attempts} "
                                      f"attempts; log {self.log_path}:\n{self.log_tail()}", log_path=self.log_path) from None
        return self

    def _launch(self, port: int) -> None:
        c = self.config
        assert self.binary is not None
        args = self.build_command(self.binary, port)
        self._check_flags(args[1:], self.binary)
        self.command = args
        self.port = port

        if c.log_path is None:
            fd, name = tempfile.mkstemp(prefix="ggufmtp-llama-server-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
            self._temp_log = True
        else:
            self.log_path = Path(c.log_path)
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_fh = open(self.log_path, "wb")
        self._log_fh.write(("$ " + shlex.join(args) + "\n").encode())
        self._log_fh.flush()
        env = dict(os.environ)
        if c.env:
            env.update(c.env)
        try:
            self.proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=self._log_fh, stderr=subprocess.STDOUT,
                start_new_session=True, env=env,
                preexec_fn=die_with_parent if sys.platform.startswith("linux") else None,
            )
        except OSError as e:
            self._close_log()
            raise ServerError(f"could not start {self.binary}: {e}") from e
        _live.add(self)
        try:
            self._wait_healthy(c.startup_timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        owned = False
        watch = StartupWatch(self.log_path, self.config.stall_timeout)
        while True:
            assert self.proc is not None and self.port is not None
            rc = self.proc.poll()
            if rc is not None:
                err = self._startup_failure(rc)
                if self.config.port is None and "could not bind" in str(err):
                    raise _BindRace()
                raise err
            # only trust /health once the listening socket is ours (not another process's
            # that grabbed the same port)
            owned = owned or owns_listening_port(self.proc.pid, self.port)
            try:
                if not owned:
                    raise ConnectionRefusedError("port not yet bound by our llama-server")
                status, body = self._raw("GET", "/health", None, timeout=5)
                if status == 200:
                    return
                last = f"HTTP {status} {body[:200].decode(errors='replace').strip()}"
            except (OSError, http.client.HTTPException) as e:
                last = f"{type(e).__name__}: {e}"
            if watch.stalled(listening=owned):
                raise ServerError(
                    f"llama-server made no progress for {watch.limit:.0f}s (no new log output, not listening "
                    f"on {HOST}:{self.port}): it looks hung; log {self.log_path}:\n{self.log_tail()}\n"
                    f"(a slow disk? raise $GGUFMTP_SERVER_STALL_TIMEOUT, seconds, 0 = never)", log_path=self.log_path)
            if time.monotonic() > deadline:
                raise ServerError(
                    f"llama-server did not become healthy within {timeout:.0f}s (last /health: {last}); "
                    f"log {self.log_path}:\n{self.log_tail()}", log_path=self.log_path)
            time.sleep(0.1)

    def key_error_line(self) -> str | None:
        """The most telling error line of the log (an assertion, a load error), if any."""
        if self.log_path is None or not self.log_path.exists():
            return None
        lines = self.log_path.read_text(errors="replace").splitlines()
        for pat in (r"GGML_ASSERT|GGML_ABORT|terminate called|what\(\):", r"error loading model:",
                    r"doesn't contain MTP|failed to create MTP context", r"\sE\s"):
            hits = [ln.strip() for ln in lines if re.search(pat, ln)]
            if hits:
                return hits[0]
        return None

    def _startup_failure(self, rc: int) -> ServerError:
        tail = self.log_tail()
        how = describe_exit(rc)
        key = self.key_error_line()
        if key and key.strip() not in tail:
            tail = f"    {key}\n    ...\n{tail}"
        if re.search(r"doesn't contain MTP layers", tail):
            return ServerError(f"llama-server could not create the MTP draft context: model {self.config.served} "
                               f"has no MTP layers ({how}); log {self.log_path}:\n{tail}", log_path=self.log_path)
        if re.search(r"failed to create MTP context", tail):  # e.g. an architecture whose MTP graph throws
            return ServerError(f"llama-server could not create the MTP draft context for model {self.config.served} "
                               f"({how}; {key or 'see the log'}); log {self.log_path}:\n{tail}", log_path=self.log_path)
        if "couldn't bind" in tail or "Address already in use" in tail:
            return ServerError(f"llama-server could not bind {HOST}:{self.port} (port in use?) and exited "
                               f"({how}); log {self.log_path}:\n{tail}", log_path=self.log_path)
        if re.search(r"failed to load model|error loading model|exiting due to model loading error", tail):
            return ServerError(f"llama-server failed to load model {self.config.served} ({how}); "
                               f"log {self.log_path}:\n{tail}", log_path=self.log_path)
        if re.search(r"error: invalid argument|unknown argument|error while handling argument", tail):
            return ServerError(f"llama-server rejected its arguments ({how}); log {self.log_path}:\n{tail}", log_path=self.log_path)
        return ServerError(f"llama-server exited during startup ({how}); log {self.log_path}:\n{tail}", log_path=self.log_path)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM the process group, then SIGKILL after ``timeout``; returns the exit status."""
        proc = self.proc
        if proc is None:
            self._close_log()
            return None
        rc = proc.poll()
        try:
            pgid = proc.pid  # start_new_session: the child leads its own group
            if rc is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGTERM)
                try:
                    rc = proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(pgid, signal.SIGKILL)
                    rc = proc.wait(10)
            # leftovers of the group (none expected: llama-server does not fork)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        finally:
            _live.discard(self)
            self._close_log()
        return rc

    def _close_log(self) -> None:
        if self._log_fh is not None:
            with contextlib.suppress(Exception):
                self._log_fh.close()
            self._log_fh = None

    def log_tail(self, n: int = LOG_TAIL_LINES) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        with open(self.log_path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            lines = fh.read().decode(errors="replace").splitlines()
        return "\n".join("    " + ln for ln in lines[-n:])

    # --- HTTP
    def _raw(self, method: str, path: str, body: dict | None, timeout: float) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(HOST, self.port, timeout=timeout)
        try:
            data = json.dumps(body).encode() if body is not None else None
            headers = {"Content-Type": "application/json"} if data is not None else {}
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def request(self, method: str, path: str, body: dict | None = None, timeout: float | None = None) -> bytes:
        """One HTTP request; a dead server raises ServerError saying it crashed."""
        if self.proc is None:
            raise ServerError("llama-server is not started")
        rc = self.proc.poll()
        if rc is not None:
            raise self._crashed(rc, f"{method} {path}")
        try:
            status, payload = self._raw(method, path, body, timeout or self.config.request_timeout)
        except (OSError, http.client.HTTPException) as e:
            # connection refused/reset or a truncated answer: did the process die?
            try:
                rc = self.proc.wait(2.0)
            except subprocess.TimeoutExpired:
                rc = None
            if rc is not None:
                raise self._crashed(rc, f"{method} {path}") from e
            if isinstance(e, TimeoutError | socket.timeout):
                raise ServerError(f"{method} {path}: no answer from llama-server within "
                                  f"{timeout or self.config.request_timeout:.0f}s") from e
            raise ServerError(f"{method} {path}: request to llama-server failed: {e}") from e
        if status >= 400:
            msg = payload[:2000].decode(errors="replace")
            with contextlib.suppress(Exception):
                j = json.loads(payload)
                msg = j.get("error", {}).get("message", msg) if isinstance(j.get("error"), dict) else msg
            raise ServerError(f"{method} {path}: llama-server answered HTTP {status}: {msg}")
        return payload

    def _crashed(self, rc: int, what: str) -> ServerError:
        _live.discard(self)
        self._close_log()
        tail = self.log_tail()
        key = self.key_error_line()
        if key and key.strip() not in tail and re.search(r"GGML_ASSERT|GGML_ABORT|terminate|what\(\)", key):
            tail = f"    {key}\n    ...\n{tail}"
        return ServerError(
            f"llama-server (pid {self.proc.pid if self.proc else '?'}) crashed: it died ({describe_exit(rc)}) "
            f"before or while answering {what}; log {self.log_path}:\n{tail}", log_path=self.log_path)

    def get_json(self, path: str) -> Any:
        return json.loads(self.request("GET", path))

    def post_json(self, path: str, body: dict) -> Any:
        return json.loads(self.request("POST", path, body))

    def _generate(self, path: str, body: JsonObject, seed: int | None, extra: Mapping[str, Any]) -> dict:
        """POST a non-streaming generation request: ``body``, the seed when one is given, then the
        caller's own fields (which win)."""
        if seed is not None:
            body["seed"] = seed
        body.update(extra)
        return self.post_json(path, body)

    def chat(self, messages: list[dict], max_tokens: int, temperature: float = 0.0, seed: int | None = None,
             **kw: Any) -> dict:
        """POST /v1/chat/completions (non-streaming); the JSON answer, including ``timings``."""
        return self._generate("/v1/chat/completions", {"messages": messages, "max_tokens": max_tokens,
                                                       "temperature": temperature, "stream": False}, seed, kw)

    def complete(self, prompt: str | list[int], n_predict: int, temperature: float = 0.0, seed: int | None = None,
                 **kw: Any) -> dict:
        """POST /completion (llama.cpp native; non-streaming)."""
        return self._generate("/completion", {"prompt": prompt, "n_predict": n_predict, "temperature": temperature,
                                              "stream": False}, seed, kw)

    def tokenize(self, text: str, add_special: bool = False, parse_special: bool = True) -> list[int]:
        j = self.post_json("/tokenize", {"content": text, "add_special": add_special, "parse_special": parse_special})
        return [t if isinstance(t, int) else t["id"] for t in j["tokens"]]

    def chat_prompt_tokens(self, messages: list[dict[str, str]]) -> list[int]:
        """The tokens of the generation prompt the server's chat template renders for ``messages``."""
        return self.tokenize(self.post_json("/apply-template", {"messages": messages})["prompt"])

    def props(self) -> dict:
        self._props = self.get_json("/props")
        return self._props

    def metrics(self) -> dict[str, float]:
        if not self.config.metrics:
            raise ServerError("metrics are off (ServerConfig.metrics=False)")
        return parse_prometheus(self.request("GET", "/metrics").decode(errors="replace"))

    def spec_counters(self) -> SpecCounters:
        """The speculative-decoding counters of ``/metrics`` now (cumulative since start)."""
        return SpecCounters.from_metrics(self.metrics())

    @property
    def build_info(self) -> str | None:
        props = self._props or self.props()
        return props.get("build_info")

    def slots(self) -> list[dict]:
        return self.get_json("/slots")
