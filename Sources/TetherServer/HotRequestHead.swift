import HTTPTypes
import NIOCore
import NIOHTTP1
import NIOHTTPTypesHTTP1

/// Reads the head of a request straight from a connection's bytes, for ``HotRequestReader``:
/// the request line and header fields of a hot request — a `GET` publish, signal, subscribe or
/// time request, or a `POST` publish with one `Content-Length` — or of a `GET` or `DELETE`
/// without a body to any other route, in the plainest HTTP/1.1 there is (RFC 9112).
///
/// It reads only what it can read with certainty and hands everything else to NIO's HTTP/1
/// parser, which then reads the connection from that request on: a method, target or version it
/// does not take, any byte outside the grammar below, `Transfer-Encoding`, `Upgrade`, `Expect`,
/// `Proxy-Connection`, a second `Content-Length`, `Host` or `Connection`, a `Connection` other
/// than `close` or `keep-alive`, a `Content-Length` with a tab around it, a body on anything but
/// a hot `POST`, a line folded or ended by a bare LF, a head longer than ``maxHeadBytes`` or with
/// more than ``maxFields`` fields. What it takes, NIO's parser takes too, and frames the same way
/// (a `GET` or `DELETE` ends with its head, a `POST` after its `Content-Length`), so the two never
/// disagree on where a request ends (the way to smuggle a request past a server that parses
/// twice).
///
/// - Request line: `GET`, `POST` or `DELETE`, one space, an origin-form target (`/`, then bytes
///   `0x21`–`0x7E`), one space, `HTTP/1.1`, CRLF.
/// - Each field: a token name, `:`, optional whitespace, a value of bytes `0x20`–`0x7E` and tabs,
///   CRLF; whitespace around the value is not part of it (RFC 9110 §5.5).
/// - An empty line (CRLF) ends the head.
enum HotRequestHead {
    /// What the bytes at the start of a connection's input are.
    enum Parse: Equatable {
        /// Not a whole head yet (and no longer than ``maxHeadBytes`` so far).
        case incomplete
        /// Not a request this reader takes: NIO's parser reads the connection from here on.
        case handOver
        /// A hot request: its head, the head's length in bytes (with the empty line), and the
        /// length of the body that follows it.
        case request(HTTPRequest, headBytes: Int, bodyBytes: Int)
        /// A plain `GET` or `DELETE` without a body to another route (history, presence, App
        /// Context, …): its head as NIO's decoder would have made it, for ``HotPathHandler`` to
        /// pass on to Hummingbird, and its length in bytes. The reader reads on after its answer,
        /// so a client that mixes such requests with hot ones keeps its hot requests here.
        case passOn(HTTPRequestHead, headBytes: Int)
    }

    private enum Method {
        case get, post, delete
    }

    /// The longest head read here; a longer one (or the start of one) goes to NIO's parser, with
    /// its own limits. Every hot request of a PubNub SDK is well under it.
    static let maxHeadBytes = 8 * 1024
    /// The most header fields read here.
    static let maxFields = 64

    /// Parses the head at the start of `bytes`.
    /// - Parameter maxBodyBytes: the largest body a hot `POST` may declare
    ///   (``HotPathHandler``'s bound); a larger one goes to NIO's parser, and on to Hummingbird.
    static func parse(_ bytes: UnsafeRawBufferPointer, maxBodyBytes: Int) -> Parse {
        var scanner = Scanner(bytes: bytes)
        // Request line.
        let method: Method
        if scanner.skip("GET ") {
            method = .get
        } else if scanner.skip("POST ") {
            method = .post
        } else if scanner.skip("DELETE ") {
            method = .delete
        } else {
            return scanner.undecided(else: .handOver, prefixOf: ["GET ", "POST ", "DELETE "])
        }
        let isPost = method == .post
        let targetStart = scanner.index
        while scanner.index < bytes.count, (0x21...0x7E).contains(bytes[scanner.index]) { scanner.index += 1 }
        guard scanner.index < bytes.count else { return scanner.incompleteOrTooLong }
        let targetEnd = scanner.index
        guard targetEnd > targetStart, bytes[targetStart] == UInt8(ascii: "/") else { return .handOver }
        guard scanner.skip(" HTTP/1.1\r\n") else {
            return scanner.undecided(else: .handOver, prefixOf: [" HTTP/1.1\r\n"])
        }
        let target = String(decoding: UnsafeRawBufferPointer(rebasing: bytes[targetStart..<targetEnd]), as: UTF8.self)
        // A hot request's fields go into HTTPTypes' `HTTPFields`, another's into NIO's
        // `HTTPHeaders`, as NIO's decoder makes them; a POST to another route is NIO's.
        let hot = method != .delete && isHotRoute(post: isPost, path: target)
        guard hot || !isPost else { return .handOver }

        // Header fields.
        var fields = HTTPFields()
        var headers = HTTPHeaders()
        var authority: String?
        var contentLength: Int?
        var connection = false
        var count = 0
        while true {
            guard scanner.index < bytes.count else { return scanner.incompleteOrTooLong }
            if bytes[scanner.index] == UInt8(ascii: "\r") {
                guard scanner.index + 1 < bytes.count else { return scanner.incompleteOrTooLong }
                guard bytes[scanner.index + 1] == UInt8(ascii: "\n") else { return .handOver }
                scanner.index += 2
                break
            }
            count += 1
            guard count <= maxFields else { return .handOver }
            let nameStart = scanner.index
            while scanner.index < bytes.count, isTokenByte(bytes[scanner.index]) { scanner.index += 1 }
            guard scanner.index < bytes.count else { return scanner.incompleteOrTooLong }
            // No name (a folded line starts with whitespace), or a byte a name cannot have.
            guard scanner.index > nameStart, bytes[scanner.index] == UInt8(ascii: ":") else { return .handOver }
            let nameEnd = scanner.index
            scanner.index += 1
            let afterColon = scanner.index
            while scanner.index < bytes.count, bytes[scanner.index] == 0x20 || bytes[scanner.index] == 0x09 { scanner.index += 1 }
            let valueStart = scanner.index
            while scanner.index < bytes.count, isValueByte(bytes[scanner.index]) { scanner.index += 1 }
            guard scanner.index + 1 < bytes.count else { return scanner.incompleteOrTooLong }
            guard bytes[scanner.index] == UInt8(ascii: "\r"), bytes[scanner.index + 1] == UInt8(ascii: "\n") else { return .handOver }
            var valueEnd = scanner.index
            while valueEnd > valueStart, bytes[valueEnd - 1] == 0x20 || bytes[valueEnd - 1] == 0x09 { valueEnd -= 1 }
            scanner.index += 2

            let rawName = UnsafeRawBufferPointer(rebasing: bytes[nameStart..<nameEnd])
            var value = String(decoding: UnsafeRawBufferPointer(rebasing: bytes[valueStart..<valueEnd]), as: UTF8.self)
            let name: HTTPField.Name
            if equalsLowercased(rawName, "content-length") {
                // Digits between spaces only: llhttp refuses a tab around them.
                guard contentLength == nil, !bytes[afterColon..<scanner.index - 2].contains(0x09),
                      let length = decimal(UnsafeRawBufferPointer(rebasing: bytes[valueStart..<valueEnd]))
                else { return .handOver }
                // A GET's is exactly `0` (or absent), as ``HotPathHandler`` reads it.
                guard isPost || valueEnd - valueStart == 1 else { return .handOver }
                contentLength = length
                name = .contentLength
            } else if equalsLowercased(rawName, "host") {
                // The request's authority, not one of its fields (as NIO's conversion makes it).
                guard authority == nil else { return .handOver }
                authority = value
                if !hot { headers.add(name: String(decoding: rawName, as: UTF8.self), value: value) }
                continue
            } else if equalsLowercased(rawName, "connection") {
                // `close` ends the connection after the answer (``HotPathHandler`` reads exactly
                // `close`); `keep-alive` is HTTP/1.1's default. A list, a second one, or
                // `upgrade`, is NIO's.
                guard !connection else { return .handOver }
                connection = true
                switch value.lowercased() {
                case "close": value = "close"
                case "keep-alive": break
                default: return .handOver
                }
                name = .connection
            } else if equalsLowercased(rawName, "transfer-encoding") || equalsLowercased(rawName, "upgrade")
                        || equalsLowercased(rawName, "expect") || equalsLowercased(rawName, "proxy-connection") {
                // Framing, a protocol switch, an interim answer, or (llhttp reads it as
                // `Connection`) whether the connection persists: NIO's.
                return .handOver
            } else if hot {
                guard let other = HTTPField.Name(String(decoding: rawName, as: UTF8.self)) else { return .handOver }
                name = other
            } else {
                headers.add(name: String(decoding: rawName, as: UTF8.self), value: value)
                continue
            }
            if hot {
                fields.append(HTTPField(name: name, value: value))
            } else {
                // Content-Length or Connection, as sent (`close` as the hot path marks it).
                headers.add(name: String(decoding: rawName, as: UTF8.self), value: value)
            }
        }
        guard scanner.index <= maxHeadBytes else { return .handOver }
        let bodyBytes: Int
        if isPost {
            guard let contentLength, contentLength <= maxBodyBytes else { return .handOver }
            bodyBytes = contentLength
        } else {
            // A GET or DELETE with a body is NIO's (Hummingbird discards a GET's as it streams).
            guard contentLength == nil || contentLength == 0 else { return .handOver }
            bodyBytes = 0
        }
        guard hot else {
            return .passOn(HTTPRequestHead(version: .http1_1, method: method == .get ? .GET : .DELETE, uri: target, headers: headers),
                           headBytes: scanner.index)
        }
        let request = HTTPRequest(method: isPost ? .post : .get, scheme: "http", authority: authority, path: target, headerFields: fields)
        return .request(request, headBytes: scanner.index, bodyBytes: bodyBytes)
    }

    /// The hot routes: `GET` publish, signal, subscribe and time, and `POST` publish
    /// (``HotPathHandler`` passes a request on when it is not one of them).
    static func isHotRoute(post: Bool, path: String) -> Bool {
        if post { return path.hasPrefix("/publish/") }
        return path.hasPrefix("/v2/subscribe/") || path.hasPrefix("/publish/") || path.hasPrefix("/signal/") || path.hasPrefix("/time/")
    }

    /// A response as NIO's HTTP/1 encoder writes it (the status line with NIO's reason phrase,
    /// then each field as given, in order), with its framing fields after them —
    /// `Content-Length: <the body's length>` (not for a status without a body: 1xx, 204, 304) and
    /// `Date: <date>` — and a body of up to `inlineBody` bytes in the same buffer. A
    /// `Content-Length` or `Date` among the response's own fields is not written: the answer's
    /// are. They are written here rather than set in the response's fields, where the `Date`
    /// grew the fields' storage and was checked as a new field for every answer
    /// (docs/benchmarks.md, fifteenth pass).
    static func encode(_ head: HTTPResponse, body: inout ByteBuffer, date: String, allocator: ByteBufferAllocator,
                       inlineBody: Int = 16 * 1024) -> ByteBuffer {
        let inline = body.readableBytes <= inlineBody
        let status = HTTPResponseStatus(statusCode: head.status.code, reasonPhrase: head.status.reasonPhrase)
        let code = head.status.code
        // NIO's encoder drops the length of a response that has no body by its status.
        let bodiless = (100..<200).contains(code) || code == 204 || code == 304
        let length = bodiless ? "" : String(body.readableBytes)
        // The exact size, so the buffer is allocated once and never grown.
        var size = 9 + 3 + 1 + status.reasonPhrase.utf8.count + 2 + 2 + (inline ? body.readableBytes : 0)
        if !bodiless { size += 16 + length.utf8.count + 2 }
        size += 6 + date.utf8.count + 2
        for field in head.headerFields where !isFraming(field.name) {
            size += field.name.rawName.utf8.count + 2 + field.value.utf8.count + 2
        }
        var out = allocator.buffer(capacity: size)
        out.writeStaticString("HTTP/1.1 ")
        out.writeString(String(status.code))
        out.writeStaticString(" ")
        out.writeString(status.reasonPhrase)
        out.writeStaticString("\r\n")
        for field in head.headerFields where !isFraming(field.name) {
            out.writeString(field.name.rawName)
            out.writeStaticString(": ")
            out.writeString(field.value)
            out.writeStaticString("\r\n")
        }
        if !bodiless {
            out.writeStaticString("Content-Length: ")
            out.writeString(length)
            out.writeStaticString("\r\n")
        }
        out.writeStaticString("Date: ")
        out.writeString(date)
        out.writeStaticString("\r\n\r\n")
        if inline { out.writeBuffer(&body) }
        return out
    }

    /// The response head NIO's encoder writes for an answer with a body of `bodyLength` bytes:
    /// ``encode(_:body:date:allocator:inlineBody:)``'s framing fields set in it (for a connection
    /// handed over to NIO's HTTP/1 pipeline).
    static func framed(_ head: HTTPResponse, bodyLength: Int, date: String) -> HTTPResponseHead {
        var framed = HTTPResponseHead(head)
        framed.headers.replaceOrAdd(name: "Content-Length", value: String(bodyLength))
        framed.headers.replaceOrAdd(name: "Date", value: date)
        return framed
    }

    /// `Content-Length` and `Date`: written by the encoder, not taken from a response's fields.
    private static func isFraming(_ name: HTTPField.Name) -> Bool {
        name == .contentLength || name == .date
    }

    // MARK: Bytes

    private struct Scanner {
        let bytes: UnsafeRawBufferPointer
        var index = 0

        /// Skips `literal` if the bytes at the index are it.
        mutating func skip(_ literal: StaticString) -> Bool {
            let count = literal.utf8CodeUnitCount
            guard bytes.count - index >= count else { return false }
            let start = literal.utf8Start
            for offset in 0..<count where bytes[index + offset] != start[offset] { return false }
            index += count
            return true
        }

        /// When a literal did not match: `incomplete` if the bytes left are the start of one of
        /// `literals` (more may complete it), `otherwise` if not.
        func undecided(else otherwise: Parse, prefixOf literals: [StaticString]) -> Parse {
            let left = bytes.count - index
            for literal in literals where left < literal.utf8CodeUnitCount {
                let start = literal.utf8Start
                if (0..<left).allSatisfy({ bytes[index + $0] == start[$0] }) { return incompleteOrTooLong }
            }
            return otherwise
        }

        /// The bytes ran out: more may come, unless the head is already too long for this reader.
        var incompleteOrTooLong: Parse { bytes.count >= HotRequestHead.maxHeadBytes ? .handOver : .incomplete }
    }

    /// `tchar` (RFC 9110 §5.6.2).
    private static func isTokenByte(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "0")...UInt8(ascii: "9"):
            return true
        case UInt8(ascii: "!"), UInt8(ascii: "#"), UInt8(ascii: "$"), UInt8(ascii: "%"), UInt8(ascii: "&"), UInt8(ascii: "'"),
             UInt8(ascii: "*"), UInt8(ascii: "+"), UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "^"), UInt8(ascii: "_"),
             UInt8(ascii: "`"), UInt8(ascii: "|"), UInt8(ascii: "~"):
            return true
        default:
            return false
        }
    }

    /// A field value's byte here: visible ASCII, space or tab (no `obs-text`: NIO's).
    private static func isValueByte(_ byte: UInt8) -> Bool {
        (0x20...0x7E).contains(byte) || byte == 0x09
    }

    /// Whether `raw` is `lowercase` in any case.
    private static func equalsLowercased(_ raw: UnsafeRawBufferPointer, _ lowercase: StaticString) -> Bool {
        guard raw.count == lowercase.utf8CodeUnitCount else { return false }
        let start = lowercase.utf8Start
        for offset in 0..<raw.count {
            var byte = raw[offset]
            if byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "Z") { byte += 0x20 }
            if byte != start[offset] { return false }
        }
        return true
    }

    /// A `Content-Length`: 1–15 digits and nothing else.
    private static func decimal(_ raw: UnsafeRawBufferPointer) -> Int? {
        guard !raw.isEmpty, raw.count <= 15 else { return nil }
        var value = 0
        for byte in raw {
            guard byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9") else { return nil }
            value = value * 10 + Int(byte - UInt8(ascii: "0"))
        }
        return value
    }
}
