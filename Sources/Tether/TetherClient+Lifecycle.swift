public import TetherClientCore
import Synchronization

extension TetherClient {
    // MARK: - App lifecycle

    /// Tells the client the app went to the background (React Native's way; SendBird's
    /// `setBackgroundState`). What happens follows ``TetherConfiguration/lifecycle``'s
    /// ``LifecycleOptions/backgroundPolicy``:
    ///
    /// - ``BackgroundPolicy/disconnect``: the connection is let go with a presence `leave`
    ///   (`bye` on a WebSocket session); ``connectionState`` becomes ``ConnectionState/background``
    ///   and the cursor is kept.
    /// - ``BackgroundPolicy/suspend(keepAlive:keepPresence:)``: the server is asked to keep the WebSocket
    ///   session (and presence) for the keep-alive; the socket closes without `bye`.
    /// - ``BackgroundPolicy/keep``: the subscription goes on while the system allows it.
    ///
    /// Under every policy, nothing connects on its own in the background: retries, Time probes
    /// and network-up attempts wait for ``enterForeground()`` (seed 001). Calling it twice does
    /// nothing more. On Apple platforms with UIKit the client calls it itself unless
    /// ``LifecycleOptions/observesApplicationState`` is off.
    public func enterBackground() {
        engine.send { machine, now in machine.enterBackground(now: now) }
    }

    /// Tells the client the app is in the foreground again (SendBird's `setForegroundState`).
    /// The client probes the link first (a WebSocket `ping` or a Time request within
    /// ``LifecycleOptions/foregroundProbeTimeout`` — Diffusion's ping-on-foreground), resets
    /// the back-off, then resumes the kept session or resubscribes from its cursor, catching up
    /// as ``LifecycleOptions/foregroundCatchUp`` says; the reconnect events and statuses are
    /// those of any reconnection (`reconnect started`, `reconnected`, continuity outcomes). A
    /// failed probe starts a fresh outage with its retry schedule.
    public func enterForeground() {
        let overSocket = session.isOpen && currentWire() == .webSocket
        engine.send { machine, now in machine.enterForeground(now: now, probeCoversSubscription: overSocket) }
    }

    /// Names the device the server pushes to while the app is suspended: with
    /// ``BackgroundPolicy/suspend(keepAlive:keepPresence:)`` on the WebSocket wire, the `suspend`
    /// frame carries this device, and until the session is resumed (or its keep-alive lapses)
    /// every message published on the subscription's channels is pushed to it — its `pn_apns` /
    /// `pn_fcm` part when it has one, otherwise a notification with the channel as the title and
    /// the message's text as the body (docs/mobile.md). Nothing is stored: unlike
    /// ``addPushChannels(_:device:pushType:environment:topic:timeout:)``, the device gets pushes
    /// only while this session is away, as SendBird sends pushes only to disconnected users.
    /// `nil` stops it for the next suspend. The server must have a push provider configured.
    public func setBackgroundPushDevice(_ token: String?, pushType: PushType = .apns2, environment: PushEnvironment = .development,
                                        topic: String? = nil) {
        backgroundPushDevice.withLock { device in
            device = token.map { BackgroundPushDevice(token: $0, pushType: pushType, environment: environment, topic: topic) }
        }
    }

    /// Whether the app last said it is in the background.
    public var isInBackground: Bool { engine.read { $0.isInBackground } }
}
