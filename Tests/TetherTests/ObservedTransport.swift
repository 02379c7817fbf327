import Logging
@testable import Tether
import TetherTesting

/// Wraps a real transport and reports each exchange as it starts and ends, so a loopback test
/// awaits "the long-poll is on its way" or "the long-poll was cancelled" instead of polling.
final class ObservedTransport: Transport {
    enum Event: Sendable {
        case sent(TransportRequest)
        case finished(TransportRequest, Result<TransportResponse, TransportFailure>)
    }

    let base: any Transport
    let events: AsyncStream<Event>
    private let sink: AsyncStream<Event>.Continuation

    init(_ base: any Transport) {
        self.base = base
        (events, sink) = AsyncStream.makeStream(of: Event.self)
    }

    func send(_ request: TransportRequest) async throws(TransportFailure) -> TransportResponse {
        sink.yield(.sent(request))
        do {
            let response = try await base.send(request)
            sink.yield(.finished(request, .success(response)))
            return response
        } catch {
            sink.yield(.finished(request, .failure(error)))
            throw error
        }
    }

    func shutdown() async {
        await base.shutdown()
        sink.finish()
    }
}

extension AsyncStream<ObservedTransport.Event>.Iterator {
    /// The next continuation long-poll (a subscribe with a `tt` other than 0) sent.
    mutating func nextLongPollSent() async -> TransportRequest? {
        while let event = await next() {
            if case .sent(let request) = event, request.isLongPoll, !request.url.contains("tt=0") { return request }
        }
        return nil
    }

    /// How `request` ended.
    mutating func outcome(of request: TransportRequest) async -> Result<TransportResponse, TransportFailure>? {
        while let event = await next() {
            if case .finished(let finished, let result) = event, finished == request { return result }
        }
        return nil
    }
}

/// A client on the real AsyncHTTPClient transport, observed, with a manual clock for the engine's
/// timers.
func makeObservedClient(origin: String, monitor: (any NetworkMonitor)? = nil, configure: (inout TetherConfiguration) -> Void = { _ in })
    throws -> (TetherClient, ObservedTransport, ManualClock)
{
    var logger = Logger(label: "tether.test.observed")
    logger.logLevel = .warning
    var configuration = try TetherConfiguration(subscribeKey: "demo", publishKey: "demo", userId: "observer", origin: origin,
                                                useTLS: false, logger: logger)
    configuration.nonSubscribeTimeout = .seconds(10)
    configuration.deadLinkDetection = nil
    configuration.retry = RetryConfiguration(jitter: .zero ... .zero)
    configure(&configuration)
    let transport = ObservedTransport(try HTTPClientTransport(connectTimeout: .seconds(5), logger: logger))
    let clock = ManualClock()
    return (TetherClient(configuration: configuration, transport: transport, clock: clock, networkMonitor: monitor), transport, clock)
}

extension Result {
    var isFailure: Bool { if case .failure = self { true } else { false } }
}
