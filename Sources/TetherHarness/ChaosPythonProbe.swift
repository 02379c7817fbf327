/// The PubNub side of `tether chaos suite`: a Python script that runs N unmodified PubNub Python
/// SDK clients (threaded `PubNub` or asyncio `PubNubAsyncio`, the SDK's default configuration
/// apart from origin, TLS, user id and auth key) on one channel and prints the same JSON lines as
/// `tether chaos probe`. The suite writes it to its work directory and runs it with the chosen
/// Python (`--python`), which needs `pubnub` installed (`pip install pubnub==10.8.0`).
enum ChaosPythonProbe {
    /// The script's text.
    static let script = #"""
import argparse
import asyncio
import json
import sys
import threading
import time

from pubnub.callbacks import SubscribeCallback
from pubnub.pnconfiguration import PNConfiguration

_lock = threading.Lock()


def emit(**fields):
    fields["at"] = int(time.time() * 1000)
    line = json.dumps(fields, separators=(",", ":"))
    with _lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class Listener(SubscribeCallback):
    def __init__(self, index):
        self.index = index

    def status(self, pubnub, status):
        category = getattr(status.category, "name", str(status.category))
        emit(c=self.index, e="status", cat=category)

    def message(self, pubnub, message):
        payload = message.message
        seq = payload.get("seq", -1) if isinstance(payload, dict) else -1
        emit(c=self.index, e="msg", seq=seq, tt=str(message.timetoken))

    def presence(self, pubnub, presence):
        pass


def make_config(args, index):
    config = PNConfiguration()
    config.subscribe_key = args.sub_key
    config.publish_key = args.pub_key
    config.user_id = f"{args.user_prefix}-{index}"
    config.origin = args.origin
    config.ssl = False
    config.daemon = True
    if args.auth_key:
        config.auth_key = args.auth_key
    return config


def run_threaded(args):
    from pubnub.pubnub import PubNub
    clients = []
    for index in range(args.clients):
        pubnub = PubNub(make_config(args, index))
        pubnub.add_listener(Listener(index))
        pubnub.subscribe().channels([args.channel]).execute()
        clients.append(pubnub)
    for _ in sys.stdin:
        pass
    for pubnub in clients:
        try:
            pubnub.unsubscribe_all()
            pubnub.stop()
        except Exception:
            pass


async def run_asyncio(args):
    from pubnub.pubnub_asyncio import PubNubAsyncio
    clients = []
    for index in range(args.clients):
        pubnub = PubNubAsyncio(make_config(args, index))
        pubnub.add_listener(Listener(index))
        pubnub.subscribe().channels([args.channel]).execute()
        clients.append(pubnub)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)
    for pubnub in clients:
        try:
            pubnub.unsubscribe_all()
            await pubnub.stop()
        except Exception:
            pass


def main():
    parser = argparse.ArgumentParser(description="PubNub Python SDK clients for tether chaos suite")
    parser.add_argument("--mode", choices=["threaded", "asyncio"], required=True)
    parser.add_argument("--origin", required=True)
    parser.add_argument("--channel", required=True)
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument("--sub-key", default="demo")
    parser.add_argument("--pub-key", default="demo")
    parser.add_argument("--auth-key", default=None)
    parser.add_argument("--user-prefix", default="pubnub")
    args = parser.parse_args()
    if args.mode == "threaded":
        run_threaded(args)
    else:
        asyncio.run(run_asyncio(args))


if __name__ == "__main__":
    main()
"""#
}
