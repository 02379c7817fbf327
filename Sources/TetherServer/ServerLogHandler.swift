#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
package import Logging
import Synchronization

/// The server's log handler: the same lines as swift-log's `StreamLogHandler` on standard
/// error (`<time> <level> <label>: <key=value …> [<source>] <message>`), but metadata is
/// formatted only when a line is written.
///
/// `StreamLogHandler` re-formats its whole metadata string every time a key is set. Hummingbird
/// sets `hb.request.id` on every request's logger, so at any log level that cost every request
/// a sort, a join and several allocations (~1.5 % of a request's CPU at `--log-level warning`,
/// docs/benchmarks.md). Here setting a key only stores it.
package struct ServerLogHandler: LogHandler {
    /// The logger's metadata.
    package var metadata: Logger.Metadata = [:]
    /// The minimum level written.
    package var logLevel: Logger.Level = .info
    /// Metadata added to every line.
    package var metadataProvider: Logger.MetadataProvider?
    private let label: String

    /// A handler writing to standard error.
    package init(label: String, metadataProvider: Logger.MetadataProvider? = nil) {
        self.label = label
        self.metadataProvider = metadataProvider
    }

    /// One metadata value.
    package subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    /// Writes one line.
    package func log(event: LogEvent) {
        var merged = metadata
        if let provided = metadataProvider?.get() { merged.merge(provided) { _, new in new } }
        if let explicit = event.metadata { merged.merge(explicit) { _, new in new } }
        if let error = event.error {
            merged["error.message"] = "\(error)"
            merged["error.type"] = "\(String(reflecting: type(of: error)))"
        }
        let pretty = merged.isEmpty ? "" : " " + merged.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
        let line = "\(Self.timestamp()) \(event.level)\(label.isEmpty ? "" : " ")\(label):\(pretty) [\(event.source)] \(event.message)\n"
        Self.emit(line)
    }

    /// Lines are written whole, one at a time.
    private static let output = Mutex(())

    private static func emit(_ line: String) {
        output.withLock { _ in
            var line = line
            line.withUTF8 { bytes in
                var offset = 0
                while offset < bytes.count {
                    let written = write(STDERR_FILENO, bytes.baseAddress! + offset, bytes.count - offset)
                    if written <= 0 {
                        if written < 0 && errno == EINTR { continue }
                        return
                    }
                    offset += written
                }
            }
        }
    }

    private static func timestamp() -> String {
        var now = time(nil)
        var parts = tm()
        guard localtime_r(&now, &parts) != nil else { return "<unknown>" }
        var buffer = [CChar](repeating: 0, count: 64)
        let count = strftime(&buffer, buffer.count, "%Y-%m-%dT%H:%M:%S%z", &parts)
        return String(decoding: buffer[..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}
