public import Hummingbird
public import NIOCore

/// The per-request context: Hummingbird's core storage plus the connection, which long-polls
/// watch so they stop waiting as soon as their client goes away.
public struct TetherRequestContext: RequestContext {
    /// Hummingbird's storage.
    public var coreContext: CoreRequestContextStorage
    /// The client connection.
    public let channel: any Channel
    /// A hot-path subscribe's parking state (`HotPathHandler`): with it, a long-poll with
    /// nothing to deliver parks in the hub without holding a task.
    var longPollSlot: LongPollSlot?

    /// Creates the context for a request on `source.channel`.
    public init(source: ApplicationRequestContextSource) {
        self.coreContext = .init(source: source)
        self.channel = source.channel
    }
}
