import Foundation
import ServiceLifecycle

/// Samples the console's counters once a second (the overview's time series, the long-poll
/// drop inference) and sends the overview to the live-event watchers, encoding it only when
/// somebody watches. On graceful shutdown it ends the watchers' streams first, so the HTTP
/// server's wait for in-flight requests is not held up by them.
struct ConsoleSampler: Service {
    let console: AdminConsole
    let responder: TetherResponder

    func run() async throws {
        await withGracefulShutdownHandler {
            while !Task.isCancelled && !Task.isShuttingDownGracefully {
                do {
                    try await cancelWhenGracefulShutdown { try await Task.sleep(for: .seconds(1)) }
                } catch {
                    break
                }
                _ = console.sample(now: AdminConsole.now())
                guard console.watcherCount > 0 else { continue }
                let encoder = JSONEncoder()
                encoder.outputFormatting = [.sortedKeys]
                guard let data = try? encoder.encode(responder.overview(console)) else { continue }
                console.broadcast("event: overview\ndata: \(String(decoding: data, as: UTF8.self))\n\n")
            }
        } onGracefulShutdown: {
            console.finishWatchers()
        }
        console.finishWatchers()
    }
}
