/// An incremental `multipart/form-data` parser (RFC 7578 over RFC 2046's multipart syntax):
/// bytes go in as they arrive from the socket, parts come out as events, and nothing grows
/// without a bound — a part's body is handed on chunk by chunk (the parser keeps back at most
/// one delimiter's length of it), headers are limited to ``Limits/headerBytes`` per part and
/// the number of parts to ``Limits/parts``. Pure: no I/O, so the upload route streams a file
/// part straight to disk and the hostile cases are tested in milliseconds.
///
/// ```
/// var parser = try MultipartParser(contentType: "multipart/form-data; boundary=xyz")
/// for chunk in body { for event in try parser.feed(chunk) { … } }
/// for event in try parser.finish() { … }   // throws .truncated unless the close delimiter came
/// ```
package struct MultipartParser {
    /// What the parser found.
    package enum Event: Equatable, Sendable {
        /// A part starts; its headers.
        case partStart(PartHeaders)
        /// Bytes of the current part's body (possibly one of many chunks).
        case body([UInt8])
        /// The current part ended.
        case partEnd
        /// The close delimiter: the body is complete (what follows is epilogue, ignored).
        case end
    }

    /// A part's `Content-Disposition` and `Content-Type`.
    package struct PartHeaders: Equatable, Sendable {
        /// The form field's name.
        package var name: String
        /// The file name, for a file part.
        package var filename: String?
        /// The part's `Content-Type`, if it had one.
        package var contentType: String?

        package init(name: String, filename: String? = nil, contentType: String? = nil) {
            self.name = name
            self.filename = filename
            self.contentType = contentType
        }
    }

    /// Why a body is not acceptable `multipart/form-data`.
    package enum Failure: Error, Equatable, Sendable {
        /// The request's `Content-Type` is not multipart/form-data with a valid boundary.
        case notMultipart
        /// A part's headers are longer than the limit.
        case headersTooLarge
        /// More parts than the limit.
        case tooManyParts
        /// A part's headers cannot be read (the reason, for the error body).
        case malformedHeaders(String)
        /// Bytes after a delimiter that are neither CRLF nor `--`.
        case malformedDelimiter
        /// The body ended before the close delimiter.
        case truncated
    }

    /// The bounds.
    package struct Limits: Sendable {
        /// Bytes of one part's header block.
        package var headerBytes: Int
        /// Parts in one body.
        package var parts: Int

        package init(headerBytes: Int = 8 * 1024, parts: Int = 64) {
            self.headerBytes = headerBytes
            self.parts = parts
        }
    }

    private enum State {
        /// Before the first delimiter (preamble, discarded).
        case preamble
        /// Just after a delimiter: CRLF (a part follows) or `--` (the end).
        case afterDelimiter
        /// Reading a part's header block.
        case headers
        /// Reading a part's body, up to the next delimiter.
        case body
        /// After the close delimiter.
        case done
    }

    private let delimiter: [UInt8]
    private let limits: Limits
    private var state = State.preamble
    private var buffer: [UInt8]
    private var partCount = 0

    /// A parser for a body of `contentType`; throws ``Failure/notMultipart`` unless it is
    /// `multipart/form-data` with a boundary of 1…70 characters (RFC 2046 §5.1.1).
    package init(contentType: String, limits: Limits = .init()) throws(Failure) {
        guard let boundary = Self.boundary(contentType: contentType) else { throw .notMultipart }
        self.delimiter = Array("\r\n--\(boundary)".utf8)
        self.limits = limits
        // The first delimiter may start the body without a CRLF before it: start as if one
        // had been read, so every delimiter is found the same way.
        self.buffer = [13, 10]
    }

    /// The `boundary` parameter of a `multipart/form-data` content type.
    package static func boundary(contentType: String) -> String? {
        let parts = contentType.split(separator: ";", omittingEmptySubsequences: false)
        guard let type = parts.first, type.trimmingWhitespace().lowercased() == "multipart/form-data" else { return nil }
        for parameter in parts.dropFirst() {
            guard let equals = parameter.firstIndex(of: "=") else { continue }
            guard parameter[..<equals].trimmingWhitespace().lowercased() == "boundary" else { continue }
            var value = parameter[parameter.index(after: equals)...].trimmingWhitespace()
            if value.count >= 2, value.hasPrefix("\""), value.hasSuffix("\"") { value = String(value.dropFirst().dropLast()) }
            guard (1...70).contains(value.utf8.count), value.utf8.allSatisfy({ $0 >= 0x20 && $0 < 0x7F }) else { return nil }
            return value
        }
        return nil
    }

    /// Feeds the next bytes of the body; returns what they completed.
    package mutating func feed(_ bytes: some Collection<UInt8>) throws(Failure) -> [Event] {
        guard case .done = state else {
            buffer.append(contentsOf: bytes)
            return try advance()
        }
        return []
    }

    /// The body ended: throws ``Failure/truncated`` unless the close delimiter was read.
    package mutating func finish() throws(Failure) -> [Event] {
        guard case .done = state else { throw .truncated }
        return []
    }

    /// Whether the close delimiter has been read.
    package var isComplete: Bool {
        if case .done = state { return true }
        return false
    }

    private mutating func advance() throws(Failure) -> [Event] {
        var events: [Event] = []
        var position = 0
        defer { buffer.removeFirst(position) }
        while true {
            switch state {
            case .preamble:
                guard let at = find(delimiter, in: buffer, from: position) else {
                    // Keep only what could be the start of a delimiter.
                    position = max(position, buffer.count - (delimiter.count - 1))
                    return events
                }
                position = at + delimiter.count
                state = .afterDelimiter
            case .afterDelimiter:
                // Transport padding (spaces, tabs) may follow a delimiter (RFC 2046 §5.1.1).
                var i = position
                while i < buffer.count, buffer[i] == 0x20 || buffer[i] == 0x09 { i += 1 }
                guard i - position <= 64 else { throw .malformedDelimiter }
                guard i + 2 <= buffer.count else { return events }
                if buffer[i] == 0x2D, buffer[i + 1] == 0x2D {
                    position = buffer.count
                    state = .done
                    events.append(.end)
                    return events
                }
                guard buffer[i] == 13, buffer[i + 1] == 10 else { throw .malformedDelimiter }
                position = i + 2
                partCount += 1
                guard partCount <= limits.parts else { throw .tooManyParts }
                state = .headers
            case .headers:
                guard let end = find([13, 10, 13, 10], in: buffer, from: position) ?? emptyHeaderBlock(at: position) else {
                    if buffer.count - position > limits.headerBytes { throw .headersTooLarge }
                    return events
                }
                guard end - position <= limits.headerBytes else { throw .headersTooLarge }
                let headers = try Self.parseHeaders(buffer[position..<end])
                position = end + (end == position ? 2 : 4)
                events.append(.partStart(headers))
                state = .body
            case .body:
                if let at = find(delimiter, in: buffer, from: position) {
                    if at > position { events.append(.body(Array(buffer[position..<at]))) }
                    events.append(.partEnd)
                    position = at + delimiter.count
                    state = .afterDelimiter
                } else {
                    let safe = buffer.count - (delimiter.count - 1)
                    if safe > position {
                        events.append(.body(Array(buffer[position..<safe])))
                        position = safe
                    }
                    return events
                }
            case .done:
                position = buffer.count
                return events
            }
        }
    }

    /// A part with no headers at all: the block is just the CRLF that ends it.
    private func emptyHeaderBlock(at position: Int) -> Int? {
        position + 2 <= buffer.count && buffer[position] == 13 && buffer[position + 1] == 10 ? position : nil
    }

    private func find(_ needle: [UInt8], in haystack: [UInt8], from start: Int) -> Int? {
        guard let first = needle.first, haystack.count - start >= needle.count else { return nil }
        var i = start
        let last = haystack.count - needle.count
        while i <= last {
            if haystack[i] == first {
                var j = 1
                while j < needle.count, haystack[i + j] == needle[j] { j += 1 }
                if j == needle.count { return i }
            }
            i += 1
        }
        return nil
    }

    /// Reads a header block: `Content-Disposition: form-data; name="…"[; filename="…"]` is
    /// required, `Content-Type` optional, other headers ignored.
    static func parseHeaders(_ bytes: ArraySlice<UInt8>) throws(Failure) -> PartHeaders {
        guard let text = String(validating: bytes, as: UTF8.self) else { throw .malformedHeaders("headers are not UTF-8") }
        var name: String?
        var filename: String?
        var contentType: String?
        for line in text.split(separator: "\r\n", omittingEmptySubsequences: true) {
            guard let colon = line.firstIndex(of: ":") else { throw .malformedHeaders("a header line has no colon") }
            let field = line[..<colon].trimmingWhitespace().lowercased()
            let value = line[line.index(after: colon)...].trimmingWhitespace()
            switch field {
            case "content-disposition":
                let parameters = try parseParameters(value)
                guard parameters.type.lowercased() == "form-data" else {
                    throw .malformedHeaders("Content-Disposition is not form-data")
                }
                name = parameters.values["name"]
                filename = parameters.values["filename"]
            case "content-type":
                contentType = value
            default:
                continue
            }
        }
        guard let name else { throw .malformedHeaders("a part has no Content-Disposition name") }
        return PartHeaders(name: name, filename: filename, contentType: contentType)
    }

    /// `type; key=value; key="quoted \" value"` → the type and the parameters (keys lowercased).
    static func parseParameters(_ text: String) throws(Failure) -> (type: String, values: [String: String]) {
        let scalars = Array(text.unicodeScalars)
        var i = 0
        func skipSpace() { while i < scalars.count, scalars[i] == " " || scalars[i] == "\t" { i += 1 } }
        var type = ""
        while i < scalars.count, scalars[i] != ";" { type.unicodeScalars.append(scalars[i]); i += 1 }
        var values: [String: String] = [:]
        while i < scalars.count {
            i += 1  // the ';'
            skipSpace()
            if i >= scalars.count { break }
            var key = ""
            while i < scalars.count, scalars[i] != "=", scalars[i] != ";" { key.unicodeScalars.append(scalars[i]); i += 1 }
            key = key.trimmingWhitespace().lowercased()
            guard i < scalars.count, scalars[i] == "=" else {
                throw .malformedHeaders("parameter \(String(reflecting: key)) has no value")
            }
            i += 1
            skipSpace()
            var value = ""
            if i < scalars.count, scalars[i] == "\"" {
                i += 1
                var closed = false
                while i < scalars.count {
                    let c = scalars[i]
                    if c == "\\", i + 1 < scalars.count {
                        value.unicodeScalars.append(scalars[i + 1])
                        i += 2
                        continue
                    }
                    if c == "\"" { closed = true; i += 1; break }
                    value.unicodeScalars.append(c)
                    i += 1
                }
                guard closed else { throw .malformedHeaders("unterminated quoted parameter") }
                skipSpace()
                guard i >= scalars.count || scalars[i] == ";" else { throw .malformedHeaders("text after a quoted parameter") }
            } else {
                while i < scalars.count, scalars[i] != ";" { value.unicodeScalars.append(scalars[i]); i += 1 }
                value = value.trimmingWhitespace()
            }
            if !key.isEmpty { values[key] = value }
        }
        return (type.trimmingWhitespace(), values)
    }
}

extension StringProtocol {
    fileprivate func trimmingWhitespace() -> String {
        var scalars = Substring(self).unicodeScalars[...]
        while let first = scalars.first, first == " " || first == "\t" { scalars.removeFirst() }
        while let last = scalars.last, last == " " || last == "\t" { scalars.removeLast() }
        return String(scalars)
    }
}

extension MultipartParser.Failure: CustomStringConvertible {
    package var description: String {
        switch self {
        case .notMultipart: "the content type is not multipart/form-data with a boundary"
        case .headersTooLarge: "a part's headers are too long"
        case .tooManyParts: "too many parts"
        case .malformedHeaders(let reason): reason
        case .malformedDelimiter: "bytes after a boundary are neither CRLF nor --"
        case .truncated: "the body ended before the closing boundary"
        }
    }
}
