/** @grpc/grpc-js for the tests, which compare status codes; a default import, as it is CommonJS. */
import grpcModule from '@grpc/grpc-js';

export const grpc = grpcModule;
