import HTTPTypes
import Hummingbird
import NIOCore
@_spi(Benchmarks) import TetherProtocol

/// Response construction with the headers PubNub clients expect (pubnub-wire §1.4): a JSON
/// body with a `javascript` content type, no caching, CORS open.
enum Reply {
    static let malformedFilterExpression = HTTPResponse.Status(code: 481, reasonPhrase: "Malformed Filter Expression")

    /// PubNub's 414: the URI is too long, or the request names too many channels and groups.
    static let uriTooLong = json(.uriTooLong, ErrorBody.service(status: 414, service: "Balancer", message: "Request URI Too Long"))

    static func json(_ status: HTTPResponse.Status, _ body: [UInt8], extraHeaders: HTTPFields = [:]) -> Response {
        json(status, body: .init(byteBuffer: ByteBuffer(bytes: body)), extraHeaders: extraHeaders)
    }

    /// A JSON response whose body is written as it is produced (streamed, chunked).
    static func json(_ status: HTTPResponse.Status, body: ResponseBody, extraHeaders: HTTPFields = [:]) -> Response {
        var headers = jsonHeaders
        if !extraHeaders.isEmpty { headers.append(contentsOf: extraHeaders) }
        return Response(status: status, headers: headers, body: body)
    }

    /// Every JSON response's header fields, made (and checked) once and shared: a response
    /// copies them on write.
    private static let jsonHeaders: HTTPFields = [
        .contentType: "text/javascript; charset=\"UTF-8\"",
        .cacheControl: "no-cache",
        .accessControlAllowOrigin: "*",
        .accessControlAllowMethods: "GET, POST, DELETE, OPTIONS",
    ]

    static func json(_ status: HTTPResponse.Status, _ text: String, extraHeaders: HTTPFields = [:]) -> Response {
        json(status, body: .init(byteBuffer: ByteBuffer(string: text)), extraHeaders: extraHeaders)
    }

    /// The generic JSON error object.
    static func error(_ status: HTTPResponse.Status, service: String, _ message: String) -> Response {
        json(status, ErrorBody.service(status: status.code, service: service, message: message))
    }

    /// The publish-family error array `[0,"<text>","<tt>"]`.
    static func publishError(_ status: HTTPResponse.Status, _ text: String, timetoken: Timetoken) -> Response {
        json(status, ErrorBody.publish(text, timetoken: timetoken))
    }

    /// The history v3 error object.
    static func historyError(_ status: HTTPResponse.Status, _ message: String) -> Response {
        json(status, ErrorBody.history(status: status.code, message: message))
    }
}

extension HTTPField.Name {
    static let retryAfter = HTTPField.Name("Retry-After")!
    /// Tether extension: the bounds of messages a catching-up subscriber can no longer receive.
    static let tetherGap = HTTPField.Name("X-Tether-Gap")!
    /// Tether extension: a publish repeated a request id within the dedup window; the
    /// timetoken is the original's and nothing new was stored or delivered.
    static let tetherDuplicate = HTTPField.Name("Tether-Duplicate")!
    /// Set on every answer once graceful shutdown has started: a client with other origins
    /// sends its next request elsewhere (docs/connection-lifecycle.md, "Failover").
    static let tetherDraining = HTTPField.Name("Tether-Draining")!
    /// Tether extension on `message-counts`: the cursor the counts go through. Every stored
    /// message up to it is counted, none after it, so a subscription resumed from it misses and
    /// repeats nothing (the SDK's unread-counts foreground, docs/mobile.md).
    static let tetherCountedThrough = HTTPField.Name("Tether-Counted-Through")!
}
