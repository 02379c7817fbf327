// The SDK's public vocabulary lives in TetherClientCore (statuses, requests, results) and
// TetherProtocol (timetokens, JSON values); apps import only `Tether`.
@_exported public import TetherClientCore
@_exported public import TetherProtocol
