"""`metro serve --kv-events`: prefix-cache events over ZeroMQ, read by pyzmq (its own libzmq) and
decoded by msgspec into structs declared here with the fields vLLM's KV events carry, strictly
typed, in both layouts (map: vLLM's current one; array: its earlier one)."""

import json
import time
from typing import Optional, Union

import msgspec
import zmq

from e2e_util import MetroServer, env_int, metrics, request
from webdriver import free_port


# The map layout: each event a map tagged by its class name under "type".
class BlockStored(msgspec.Struct, tag=True, forbid_unknown_fields=True):
    block_hashes: list[int]
    parent_block_hash: Optional[int]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]
    lora_name: Optional[str]


class BlockRemoved(msgspec.Struct, tag=True, forbid_unknown_fields=True):
    block_hashes: list[int]
    medium: Optional[str]


class AllBlocksCleared(msgspec.Struct, tag=True, forbid_unknown_fields=True):
    pass


class KVEventBatch(msgspec.Struct, forbid_unknown_fields=True):
    ts: float
    events: list[Union[BlockStored, BlockRemoved, AllBlocksCleared]]
    data_parallel_rank: Optional[int] = None


# The array layout: every struct an array, an event's tag first.
class ABlockStored(msgspec.Struct, tag="BlockStored", array_like=True):
    block_hashes: list[int]
    parent_block_hash: Optional[int]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]


class ABlockRemoved(msgspec.Struct, tag="BlockRemoved", array_like=True):
    block_hashes: list[int]
    medium: Optional[str]


class AAllBlocksCleared(msgspec.Struct, tag="AllBlocksCleared", array_like=True):
    pass


class AKVEventBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[Union[ABlockStored, ABlockRemoved, AAllBlocksCleared]]
    data_parallel_rank: Optional[int] = None


def receive(sub, decoder, until, timeout=30):
    """(seq, batch) messages until `until(batches)` holds."""
    got = []
    deadline = time.time() + timeout
    while not until(got):
        assert time.time() < deadline, f"no such events in {timeout} s: {got}"
        if sub.poll(200):
            topic, seq, payload = sub.recv_multipart()
            assert topic == b"metro", topic
            got.append((int.from_bytes(seq, "big", signed=True), decoder.decode(payload)))
    return got


def stored(batches):
    return [e for _, b in batches for e in b.events if type(e).__name__.endswith("BlockStored")]


def removed_hashes(batches):
    return {h for _, b in batches for e in b.events if type(e).__name__.endswith("BlockRemoved") for h in e.block_hashes}


def run_server(ctx, fmt, port, replay_port):
    return MetroServer(ctx.metro, ctx.model_path, [
        "--model-name", "m", "--ctx", "512", "--ctx-total", "512", "--kv-block", "16", "--admission", "off",
        "--kv-events", f"tcp://*:{port}", "--kv-events-topic", "metro", "--kv-events-replay", f"tcp://*:{replay_port}",
        "--kv-events-format", fmt, "-t", str(env_int("METRO_E2E_THREADS", 2))])


def complete(port, prompt):
    st, _, body = request(port, "POST", "/v1/completions",
                          {"model": "m", "prompt": prompt, "max_tokens": 1, "temperature": 0})
    assert st == 200, body


def t_kv_events(ctx):
    """A prompt's full blocks arrive as BlockStored with its tokens, chained; prompts that fill
    the 32-block cache evict them as BlockRemoved; sequence numbers count up from 0 and the
    replay socket resends them; both layouts decode strictly."""
    zc = zmq.Context()
    for fmt, decoder in (("map", msgspec.msgpack.Decoder(KVEventBatch)),
                         ("array", msgspec.msgpack.Decoder(AKVEventBatch))):
        port, replay_port = free_port(), free_port()
        srv = run_server(ctx, fmt, port, replay_port)
        srv.start()
        sub = zc.socket(zmq.SUB)
        sub.connect(f"tcp://127.0.0.1:{port}")
        sub.setsockopt(zmq.SUBSCRIBE, b"metro")
        try:
            srv.wait_ready()
            time.sleep(0.5)  # the subscription reaches the publisher
            prompt = " ".join(f"item{i}" for i in range(60))
            st, _, body = request(srv.port, "POST", "/tokenize", {"prompt": prompt})
            assert st == 200, body
            ids = json.loads(body)["tokens"]
            n_full = len(ids) // 16
            assert n_full >= 3, len(ids)
            complete(srv.port, prompt)

            def prompt_chain(batches):
                """The chain of stored blocks that starts with the prompt's first block (the
                server's own start-up requests store other chains first)."""
                chain, tokens = [], []
                for e in stored(batches):
                    if not chain and e.parent_block_hash is None and e.token_ids[:16] == ids[:16]:
                        chain, tokens = list(e.block_hashes), list(e.token_ids)
                    elif chain and e.parent_block_hash == chain[-1]:
                        chain += e.block_hashes
                        tokens += e.token_ids
                return chain, tokens

            got = receive(sub, decoder, lambda g: len(prompt_chain(g)[0]) >= n_full)
            chain, tokens = prompt_chain(got)
            for e in stored(got):
                assert e.block_size == 16 and e.medium == "CPU" and e.lora_id is None, e
                assert len(e.token_ids) == 16 * len(e.block_hashes), e
            assert tokens[:16 * n_full] == ids[:16 * n_full], (tokens, ids)
            first = chain[:n_full]
            # Other prompts fill the 32-block cache: the first prompt's blocks are evicted.
            for k in range(6):
                complete(srv.port, " ".join(f"other{k}x{i}" for i in range(90)))
            got += receive(sub, decoder, lambda g: set(first) <= removed_hashes(got + g))
            seqs = [s for s, _ in got]
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs
            # Replay from the first sequence number received: the same batches again, then -1.
            dealer = zc.socket(zmq.DEALER)
            dealer.connect(f"tcp://127.0.0.1:{replay_port}")
            dealer.send_multipart([b"", seqs[0].to_bytes(8, "big")])
            replayed = []
            while True:
                assert dealer.poll(10000), "no replay answer"
                _, seq, payload = dealer.recv_multipart()
                s = int.from_bytes(seq, "big", signed=True)
                if s == -1:
                    assert payload == b""
                    break
                replayed.append((s, decoder.decode(payload)))
            dealer.close(0)
            assert [s for s, _ in replayed][:len(seqs)] == seqs, (replayed, seqs)
            assert [b for _, b in replayed][:len(got)] == [b for _, b in got]
            m = metrics(srv.port)
            assert m["metro_kv_events_published_total"] >= len(got) and m["metro_kv_events_dropped_total"] == 0, m
            ctx.note(f"kv events ({fmt}): {len(got)} batches, {len(first)} blocks stored then evicted, replayed")
        finally:
            sub.close(0)
            srv.kill()
    zc.term()


def t_kv_events_refuses_what_cannot_work(ctx):
    """A malformed endpoint, or events with the prefix cache off, stop the server at start."""
    import subprocess
    for args, want in ((["--kv-events", "localhost:5557"], "ZeroMQ endpoint"),
                       (["--kv-events", "tcp://*:5557", "--no-prefix-cache"], "prefix cache")):
        p = subprocess.run([ctx.metro, "serve", "-m", ctx.model_path, "--port", "0"] + args,
                           capture_output=True, text=True, timeout=60)
        assert p.returncode != 0 and want in p.stderr, (args, p.returncode, p.stderr)


TESTS = [t_kv_events, t_kv_events_refuses_what_cannot_work]
