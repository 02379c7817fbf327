import TetherClientCore

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

    /// Whether the app last said it is in the background.
    public var isInBackground: Bool { engine.read { $0.isInBackground } }
}
