import HTTPTypes
import Hummingbird
import NIOCore
import Prometheus
@_spi(Benchmarks) import TetherProtocol

/// The operations endpoints: time (pubnub-wire §4), health and metrics.
extension TetherResponder {
    /// `/time/0`: the visible cursor.
    func time() -> Response {
        var w = JSONWriter(capacity: 24)
        w.raw("[")
        w.number(state.hub.currentCursor.rawValue)
        w.raw("]")
        return Reply.json(.ok, w.bytes)
    }

    /// `/health`: the store's condition, uptime, waiting long-polls, the visible cursor.
    @inline(never) func health() async -> Response {
        // Cheap: the last write's outcome, or a tiny probe at most once a second (never a scan).
        let condition: StoreCondition
        if let shared = state.hub.shared { condition = await shared.condition() } else { condition = await state.store.condition() }
        let healthy = condition == .writable
        let uptime = ContinuousClock.now - state.startedAt
        var w = JSONWriter()
        w.raw("{\"status\":")
        w.string(healthy ? "ok" : "degraded")
        w.raw(",\"store\":")
        w.string(condition.rawValue)
        w.raw(",\"uptime_seconds\":")
        w.number(uptime.components.seconds)
        w.raw(",\"waiting_long_polls\":")
        w.number(state.hub.waitingCount)
        w.raw(",\"timetoken\":")
        w.timetokenString(state.hub.currentCursor)
        w.raw("}")
        return Reply.json(healthy ? .ok : .serviceUnavailable, w.bytes)
    }

    /// `/metrics`: the Prometheus registry, when enabled.
    func metrics() -> Response {
        guard let registry = state.registry else {
            return Reply.error(.notFound, service: "Tether", "Metrics are not enabled on this server")
        }
        var bytes: [UInt8] = []
        registry.emit(into: &bytes)
        return Response(status: .ok, headers: [.contentType: "text/plain; version=0.0.4; charset=utf-8"],
                        body: .init(byteBuffer: ByteBuffer(bytes: bytes)))
    }
}
