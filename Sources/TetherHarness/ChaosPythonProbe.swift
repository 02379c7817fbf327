/// The PubNub side of `tether chaos suite`: a Python script that runs N unmodified PubNub Python
/// SDK clients (threaded `PubNub` or asyncio `PubNubAsyncio`, the SDK's default configuration
/// apart from origin, TLS, user id and auth key) on one channel and prints the same JSON lines as
/// `tether chaos probe`. The suite writes it to its work directory and runs it with the chosen
/// Python (`--python`), which needs `pubnub` installed (`pip install pubnub==10.8.0`).
///
/// With `--recipe catch-up` (threaded mode; the background scenario) the script is an app
/// following PubNub's own recipe for scenario 1 with unsubscribing (seed 000): a line
/// `background` on standard input remembers the last received timetoken and unsubscribes;
/// `foreground` subscribes again while caching live messages without delivering them, waits for
/// the subscription to connect, fetches history from the saved timetoken + 1 (`end`) page by page
/// (each next page's `start` is the oldest timetoken of the previous one, until a page is empty),
/// then delivers history and the cached messages in timetoken order, skipping any timetoken not
/// newer than the last delivered, and goes live. Both lines are acknowledged with
/// `{"c":0,"e":"lifecycle","what":"background"}` (and `foreground`, then `caught-up` with the
/// counts when the history is delivered).
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


def seq_of(payload):
    return payload.get("seq", -1) if isinstance(payload, dict) else -1


class Listener(SubscribeCallback):
    def __init__(self, index):
        self.index = index
        # The recipe's state: the last delivered timetoken, and whether live messages are cached
        # (while history loads after the foreground) instead of delivered.
        self.lock = threading.Lock()
        self.last_tt = 0
        self.caching = False
        self.cache = []
        self.connected = threading.Event()

    def status(self, pubnub, status):
        category = getattr(status.category, "name", str(status.category))
        if category == "PNConnectedCategory":
            self.connected.set()
        emit(c=self.index, e="status", cat=category)

    def message(self, pubnub, message):
        tt = int(message.timetoken)
        seq = seq_of(message.message)
        with self.lock:
            if self.caching:
                self.cache.append((tt, seq))
                return
            self.last_tt = max(self.last_tt, tt)
            emit(c=self.index, e="msg", seq=seq, tt=str(tt))

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


class CatchUpRecipe:
    """PubNub's scenario 1 with unsubscribing (seed 000), as an app would write it."""

    def __init__(self, pubnub, listener, channel):
        self.pubnub = pubnub
        self.listener = listener
        self.channel = channel
        self.saved_tt = 0

    def background(self):
        with self.listener.lock:
            self.saved_tt = self.listener.last_tt
        # Not unsubscribe_all(): in pubnub 10.8.0 it leaves the subscription registry's channel
        # map a list, and the next subscribe() raises TypeError (docs/resilience.md).
        self.pubnub.unsubscribe().channels([self.channel]).execute()
        emit(c=self.listener.index, e="lifecycle", what="background")

    def foreground(self):
        listener = self.listener
        emit(c=listener.index, e="lifecycle", what="foreground")
        with listener.lock:
            listener.caching = True
            listener.cache = []
        listener.connected.clear()
        self.pubnub.subscribe().channels([self.channel]).execute()
        listener.connected.wait(30)
        history = []
        start = None
        pages = 0
        while True:
            request = self.pubnub.fetch_messages().channels([self.channel]).maximum_per_channel(100)
            if self.saved_tt:
                request = request.end(self.saved_tt + 1)
            if start is not None:
                request = request.start(start)
            items = None
            for attempt in range(5):
                try:
                    envelope = request.sync()
                    items = envelope.result.channels.get(self.channel, [])
                    break
                except Exception as error:
                    emit(c=listener.index, e="status", cat="history error: " + type(error).__name__)
                    time.sleep(1)
            if not items:
                break
            pages += 1
            history.extend((int(item.timetoken), seq_of(item.message)) for item in items)
            start = min(int(item.timetoken) for item in items)
        with listener.lock:
            merged = sorted(history + listener.cache)
            delivered = 0
            for tt, seq in merged:
                if tt <= listener.last_tt:
                    continue
                listener.last_tt = tt
                delivered += 1
                emit(c=listener.index, e="msg", seq=seq, tt=str(tt))
            cached = len(listener.cache)
            listener.caching = False
            listener.cache = []
        emit(c=listener.index, e="lifecycle", what="caught-up", history=len(history), pages=pages, cached=cached,
             delivered=delivered)


def run_threaded(args):
    from pubnub.pubnub import PubNub
    clients = []
    recipes = []
    for index in range(args.clients):
        pubnub = PubNub(make_config(args, index))
        listener = Listener(index)
        pubnub.add_listener(listener)
        pubnub.subscribe().channels([args.channel]).execute()
        clients.append(pubnub)
        recipes.append(CatchUpRecipe(pubnub, listener, args.channel))
    for line in sys.stdin:
        command = line.strip()
        if args.recipe != "catch-up" or command not in ("background", "foreground"):
            continue
        for recipe in recipes:
            threading.Thread(target=getattr(recipe, command), daemon=True).start()
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
    parser.add_argument("--recipe", choices=["none", "catch-up"], default="none",
                        help="catch-up: PubNub's scenario 1 recipe on background/foreground lines (threaded mode)")
    args = parser.parse_args()
    if args.mode == "threaded":
        run_threaded(args)
    else:
        asyncio.run(run_asyncio(args))


if __name__ == "__main__":
    main()
"""#
}
