"""Protobuf message classes for the tests, built from a FileDescriptorProto made in Python (no
protoc): what confluent-kafka's ProtobufSerializer takes, and what it registers (the base64 of
this descriptor, with the well-known import unregistered)."""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

_F = descriptor_pb2.FieldDescriptorProto


def _field(message, name, number, kind, label=_F.LABEL_OPTIONAL, type_name=None, oneof=None,
           proto3_optional=False):
    field = message.field.add(name=name, number=number, type=kind, label=label)
    if type_name:
        field.type_name = type_name
    if oneof is not None:
        field.oneof_index = oneof
    if proto3_optional:
        field.proto3_optional = True


def payments_file() -> descriptor_pb2.FileDescriptorProto:
    """`test.payments`: Envelope first (so that Payment's message index is [1]), then Payment
    with a nested message, an enum, a map, a repeated field, a oneof, a proto3 optional label
    and a google.protobuf.Timestamp."""
    file = descriptor_pb2.FileDescriptorProto(name="test_payments.proto",
                                              package="test.payments", syntax="proto3")
    file.dependency.append("google/protobuf/timestamp.proto")
    envelope = file.message_type.add(name="Envelope")
    _field(envelope, "source", 1, _F.TYPE_STRING)
    payment = file.message_type.add(name="Payment")
    country = payment.enum_type.add(name="Country")
    for number, name in enumerate(["UNKNOWN", "BR", "FR", "US", "IN"]):
        country.value.add(name=name, number=number)
    merchant = payment.nested_type.add(name="Merchant")
    _field(merchant, "category", 1, _F.TYPE_STRING)
    _field(merchant, "risk", 2, _F.TYPE_DOUBLE)
    entry = payment.nested_type.add(name="CountersEntry")
    entry.options.map_entry = True
    _field(entry, "key", 1, _F.TYPE_STRING)
    _field(entry, "value", 2, _F.TYPE_INT64)
    payment.oneof_decl.add(name="instrument")
    payment.oneof_decl.add(name="_is_fraud")
    _field(payment, "transaction_id", 1, _F.TYPE_STRING)
    _field(payment, "amount", 2, _F.TYPE_DOUBLE)
    _field(payment, "country", 3, _F.TYPE_ENUM, type_name=".test.payments.Payment.Country")
    _field(payment, "card_present", 4, _F.TYPE_BOOL)
    _field(payment, "merchant", 5, _F.TYPE_MESSAGE, type_name=".test.payments.Payment.Merchant")
    _field(payment, "is_fraud", 6, _F.TYPE_BOOL, oneof=1, proto3_optional=True)
    _field(payment, "event_time", 7, _F.TYPE_MESSAGE, type_name=".google.protobuf.Timestamp")
    _field(payment, "history", 8, _F.TYPE_DOUBLE, label=_F.LABEL_REPEATED)
    _field(payment, "counters", 9, _F.TYPE_MESSAGE, label=_F.LABEL_REPEATED,
           type_name=".test.payments.Payment.CountersEntry")
    _field(payment, "card_bin", 10, _F.TYPE_STRING, oneof=0)
    _field(payment, "iban", 11, _F.TYPE_STRING, oneof=0)
    return file


def message_classes() -> dict[str, type]:
    """The classes of `payments_file()` by short name (Envelope, Payment, Merchant)."""
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.AddSerializedFile(payments_file().SerializeToString())
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(full))
            for name, full in (("Envelope", "test.payments.Envelope"),
                               ("Payment", "test.payments.Payment"),
                               ("Merchant", "test.payments.Payment.Merchant"))}


PAYMENTS_PROTO_TEXT = """
// The same schema as .proto text (what Confluent's registry answers with).
syntax = "proto3";
package test.payments;
import "google/protobuf/timestamp.proto";

message Envelope { string source = 1; }

message Payment {
  enum Country { UNKNOWN = 0; BR = 1; FR = 2; US = 3; IN = 4; }
  message Merchant {
    string category = 1;
    double risk = 2;
  }
  string transaction_id = 1;
  double amount = 2;
  Country country = 3;
  bool card_present = 4;
  Merchant merchant = 5;
  optional bool is_fraud = 6;
  google.protobuf.Timestamp event_time = 7;
  repeated double history = 8 [packed = true];
  map<string, int64> counters = 9;
  oneof instrument {
    string card_bin = 10;
    string iban = 11;
  }
  reserved 20 to 25;
}
"""
