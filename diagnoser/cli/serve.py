"""``diagnose serve``: poll targets continuously and serve the web dashboard and the /metrics exporter.

    diagnose serve --url http://127.0.0.1:30000 [--url …] [--log server.log] [--host 127.0.0.1]
                   [--port 8000] [--interval 10] [--token T] [--job-requests N] [--for 60]
                   [--replay FILE --speed S --loop]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

from diagnoser.cli import UsageError
from diagnoser.cli.run import (
    API_KEY_HELP,
    WATCH_INTERVAL_S,
    _Parser,
    api_key_headers,
    load_thresholds,
    parse_duration,
)
from diagnoser.sources.http import is_loopback

TOKEN_ENV = "DIAGNOSER_TOKEN"


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="diagnose serve", description="Web dashboard and Prometheus exporter over live SGLang and vLLM servers.")
    p.add_argument("--url", action="append", default=[], help="SGLang server base URL (repeatable)")
    p.add_argument("--log", action="append", default=[], help="server log file to follow (repeatable)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to bind (default 8000)")
    p.add_argument("--interval", type=parse_duration, default=WATCH_INTERVAL_S, help="seconds between polls (default 10: keeps our polling under 0.5 %% of SGLang's time)")
    p.add_argument("--timeout", type=float, default=5.0, help="time each request to a target may take, in seconds (default 5)")
    p.add_argument("--api-key", default=None, help=API_KEY_HELP)
    p.add_argument("--window", type=parse_duration, default=300.0, help="how much recent history the rules judge (default 5m)")
    p.add_argument("--history", type=parse_duration, default=24 * 3600.0, help="history kept per target (default 24h)")
    p.add_argument("--for", dest="for_s", type=parse_duration, default=None,
                   help="how long a condition must hold before a finding fires (default: each rule's own, about 60s)")
    p.add_argument("--token", default=None, help=f"require 'Authorization: Bearer TOKEN' (or env {TOKEN_ENV})")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="also answer requests whose Host header is NAME (repeatable; '*' for any). By default only "
                        "the loopback names and the --host address are answered (a foreign Host is refused: DNS rebinding)")
    p.add_argument("--max-connections", type=int, default=None,
                   help="open connections served at once (default: from the open-file limit); past it the oldest one "
                        "still sending its request head is closed")
    p.add_argument("--insecure", action="store_true",
                   help="allow binding a non-loopback --host without --token (only on a network that is yours alone)")
    p.add_argument("--job-requests", type=int, default=None, help="total requests in the batch job, for the ETA")
    p.add_argument("--client-results", default=None, metavar="FILE",
                   help="a load tool's result file (bench_serving, vLLM, GenAI-Perf, AIPerf, GuideLLM): the first target's page "
                        "sets what the client saw beside the server over the same window")
    p.add_argument("--client-concurrency", type=int, default=None, help="requests the client keeps in flight, if known")
    p.add_argument("--model-config", help="the model's Hugging Face config.json, for the capacity model")
    p.add_argument("--avg-tokens-per-request", type=float, default=None, help="prompt + output tokens per request")
    p.add_argument("--config", help="TOML file with rule thresholds ([rules.NAME] tables)")
    p.add_argument("--set", action="append", default=[], metavar="RULE.KEY=VALUE", help="override a rule threshold")
    p.add_argument("--select", action="append", default=[], help="only run these rules (name or code)")
    p.add_argument("--ignore", action="append", default=[], help="skip these rules (name or code)")
    p.add_argument("--prometheus", help="read the targets from a Prometheus server (fleet mode; page /fleet)")
    p.add_argument("--selector", default="", help="PromQL label selector for --prometheus, e.g. '{job=\"sglang\"}'")
    p.add_argument("--step", type=parse_duration, default=None, help="query resolution for --prometheus")
    p.add_argument("--rate-window", type=parse_duration, default=None, help="rate()/quantile window for --prometheus")
    p.add_argument("--bearer-token", default=None, help="bearer token for --prometheus, or @FILE holding it")
    p.add_argument("--basic-auth", default=None, help="USER:PASSWORD for --prometheus, or @FILE holding it")
    p.add_argument("--header", action="append", default=[], help="extra 'Name: value' header for --prometheus (repeatable)")
    p.add_argument("--replay", help="play a recorded bundle as the data source")
    p.add_argument("--speed", type=float, default=1.0, help="replay speed factor (default 1)")
    p.add_argument("--loop", action="store_true", help="restart the replay when it ends")
    return p


def extras_from(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "job_requests": args.job_requests,
        "client_concurrency": args.client_concurrency,
        "model_config": args.model_config,
        "avg_tokens_per_request": getattr(args, "avg_tokens_per_request", None),
    }


def make_monitor(args: argparse.Namespace, adapter: Any) -> Any:
    from diagnoser.evaluate import select_rules
    from diagnoser.live import LiveMonitor

    if args.interval <= 0:
        raise UsageError("--interval must be above 0 seconds")
    if args.timeout <= 0:
        raise UsageError("--timeout must be above 0 seconds")
    return LiveMonitor(
        adapter, args.url, args.log, interval=args.interval, timeout=args.timeout, window_s=args.window,
        history_s=args.history, for_seconds=args.for_s, thresholds=load_thresholds(args),
        rules=select_rules(args.select, args.ignore), extras=extras_from(args), headers=api_key_headers(args),
    )


def replay_monitor(args: argparse.Namespace, adapter: Any) -> Any:
    from diagnoser.evaluate import select_rules
    from diagnoser.live import ReplayMonitor
    from diagnoser.replay import BundleError, ReplayFeed

    if args.speed <= 0:
        raise UsageError("--speed must be above 0 (1 = real time, 10 = ten times faster)")
    try:
        feed = ReplayFeed(args.replay, speed=args.speed, loop=args.loop)
    except (BundleError, OSError, ValueError) as e:
        raise UsageError(f"cannot replay {args.replay}: {e}") from None
    if not feed.records:
        raise UsageError(f"{args.replay} holds no records to replay; record one with 'diagnose record' or pass a run directory with metrics/ or server.log")
    return ReplayMonitor(
        feed, adapter, interval=args.interval, timeout=args.timeout, window_s=args.window, history_s=args.history,
        for_seconds=args.for_s, thresholds=load_thresholds(args), rules=select_rules(args.select, args.ignore),
        extras=extras_from(args),
    )


def _check_bind(host: str, port: int) -> None:
    """Fail in one sentence before start-up when the address cannot be bound (port in use, bad host)."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        raise UsageError(f"cannot resolve --host {host}; pass an address such as 127.0.0.1 or 0.0.0.0") from None
    fam, _, _, _, addr = infos[0]
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as e:
            raise UsageError(f"cannot listen on {host}:{port} ({e.strerror or e}); pick another --port") from None


def main(cmd: str, argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from diagnoser.engines import get_adapter

    client_run = None
    if args.client_results:
        from diagnoser.sources.client_results import ClientResultsError, read_client_results

        try:
            client_run = read_client_results(args.client_results)
        except ClientResultsError as e:
            raise UsageError(str(e)) from None
    adapter = get_adapter("auto")
    if args.replay:
        monitor = replay_monitor(args, adapter)
    elif args.prometheus:
        from diagnoser.evaluate import select_rules
        from diagnoser.web.fleet import fleet_monitor

        monitor = fleet_monitor(args, adapter, interval=args.interval, timeout=args.timeout, window_s=args.window,
                                history_s=args.history, for_seconds=args.for_s, thresholds=load_thresholds(args),
                                rules=select_rules(args.select, args.ignore), extras=extras_from(args))
    else:
        if not args.url and not args.log:
            raise UsageError("nothing to watch: pass --url http://HOST:30000 (repeatable) and/or --log PATH")
        if "-" in args.log:
            raise UsageError("serve follows log files; stdin (--log -) is only for --once")
        monitor = make_monitor(args, adapter)
    token = args.token or os.environ.get(TOKEN_ENV) or None
    if not is_loopback(args.host):
        if not token and not args.insecure:
            raise UsageError(f"refusing to bind --host {args.host} (not loopback) without a token: anyone who can reach it would see "
                             f"your servers' state. Pass --token T (or set {TOKEN_ENV}), or --insecure if only you can reach that network")
        extra = " with a bearer token" if token else " without a token (--insecure): anyone who can reach it sees your servers' state"
        print(f"diagnose serve: warning: binding {args.host}, not loopback: the dashboard is reachable from other machines{extra}.", file=sys.stderr)
    _check_bind(args.host, args.port)
    import uvicorn

    from diagnoser.web import create_app
    from diagnoser.web.door import (
        BACKLOG,
        KEEP_ALIVE_S,
        MAX_HEAD_BYTES,
        Door,
        HostCheck,
        default_max_connections,
        protocol,
        quick_accept_retry,
    )

    monitor.client_run = client_run  # the target page's "What the client saw" panel (web/views.py)
    if args.max_connections is not None and args.max_connections < 1:
        raise UsageError("--max-connections must be at least 1")
    door = Door(args.max_connections or default_max_connections(len(getattr(monitor, "targets", []) or [])))
    app = HostCheck(create_app(monitor, token=token, job_requests=args.job_requests), args.host, args.allow_host)
    monitor.tick(scrape=False)
    monitor.start()
    shown = f"[{args.host}]" if ":" in args.host else args.host
    print(f"diagnose serve: http://{shown}:{args.port}/ ({len(monitor.targets)} target(s), every {args.interval:g} s; /metrics for Prometheus)", file=sys.stderr, flush=True)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", access_log=False, http=protocol(door),
                            timeout_keep_alive=KEEP_ALIVE_S, h11_max_incomplete_event_size=MAX_HEAD_BYTES, backlog=BACKLOG)
    server = uvicorn.Server(config)

    quick_accept_retry()

    async def serve() -> None:
        asyncio.get_running_loop().set_exception_handler(door.loop_exception)
        await server.serve()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:  # as uvicorn.run: Ctrl-C ends it quietly
        pass
    except OSError as e:
        raise UsageError(f"cannot listen on {args.host}:{args.port} ({e.strerror or e}); pick another --port") from None
    finally:
        monitor.stop()
    return 0
